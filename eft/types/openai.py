"""Wire models of the OpenAI-compatible fine-tuning API (`/v1/fine_tuning/jobs`): the request
and object shapes of OpenAI's API, so its official clients work against this service.

Extensions beyond OpenAI's fields are accepted where they are needed to run on this service:
`hyperparameters.max_steps` and `hyperparameters.max_seq_len` (e.g. through the openai client's
`extra_body`, or as extra keys of `hyperparameters`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from eft.types._base import ListResponse, _Request, _Response
from eft.types.text import Label, Metadata

Auto = Literal["auto"]


class OpenAIHyperparameters(_Request):
    n_epochs: Auto | int = Field("auto", description="Passes over the training file (1-50).")
    batch_size: Auto | int = Field("auto", description="Examples per optimizer step (1-256).")
    learning_rate_multiplier: Auto | float = Field(
        "auto", description="Scales the base learning rate of 2e-4.")
    max_steps: int | None = Field(None, ge=1, le=10_000_000, description="Extension: stop after this many steps.")
    max_seq_len: int | None = Field(None, ge=8, le=1_048_576, description="Extension: longer examples are cut.")

    @model_validator(mode="after")
    def _ranges(self) -> OpenAIHyperparameters:
        checks = [("n_epochs", 1, 50), ("batch_size", 1, 256), ("learning_rate_multiplier", 1e-6, 100)]
        for name, low, high in checks:
            value = getattr(self, name)
            if value != "auto" and not low <= value <= high:
                raise ValueError(f"{name} must be 'auto' or between {low} and {high}, got {value}")
        return self


class Supervised(_Request):
    hyperparameters: OpenAIHyperparameters = Field(default_factory=OpenAIHyperparameters)


class DpoHyperparameters(OpenAIHyperparameters):
    beta: Auto | float = Field(
        "auto", description="How strongly the model is held to the reference model (0.1 when auto).")

    @model_validator(mode="after")
    def _beta(self) -> DpoHyperparameters:
        if self.beta != "auto" and not 0 < self.beta <= 10:
            raise ValueError(f"beta must be 'auto' or above 0 and at most 10, got {self.beta}")
        return self


class Dpo(_Request):
    hyperparameters: DpoHyperparameters = Field(default_factory=DpoHyperparameters)


class OpenAIMethod(_Request):
    type: Literal["supervised", "dpo"] = Field(
        "supervised", description="supervised (chat records) or dpo (preference pairs).")
    supervised: Supervised | None = None
    dpo: Dpo | None = None

    @property
    def hyperparameters(self) -> OpenAIHyperparameters:
        chosen = self.dpo if self.type == "dpo" else self.supervised
        return chosen.hyperparameters if chosen is not None else (
            DpoHyperparameters() if self.type == "dpo" else OpenAIHyperparameters())


class WandbIntegration(_Request):
    project: Label = Field(..., min_length=1, max_length=128)
    name: Label | None = Field(None, max_length=128)
    entity: Label | None = Field(None, max_length=128)
    tags: list[Annotated[Label, Field(max_length=64)]] | None = Field(None, max_length=20)


class Integration(_Request):
    type: Literal["wandb"] = "wandb"
    wandb: WandbIntegration


class FineTuningJobCreate(_Request):
    """OpenAI's create request; `model` is a base model this service knows (e.g. tiny-llama)."""

    model: str = Field(..., min_length=1, max_length=512, examples=["tiny-llama"])
    training_file: str = Field(..., min_length=1, max_length=2048, examples=["file-019a4f2c3b1d5e6f7a8b9c0d"])
    validation_file: str | None = Field(None, min_length=1, max_length=2048)
    hyperparameters: OpenAIHyperparameters | None = None
    method: OpenAIMethod | None = None
    suffix: Label | None = Field(None, min_length=1, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: Metadata | None = Field(None, max_length=16)
    integrations: list[Integration] | None = Field(
        None, max_length=5, description="Recorded with the job and returned as sent (OpenAI's wandb shape); the "
        "job's metrics go to the trackers this service runs (TensorBoard, MLflow: `trackers` on /jobs).")

    @property
    def resolved_hyperparameters(self) -> OpenAIHyperparameters:
        if self.method is not None:
            return self.method.hyperparameters
        return self.hyperparameters or OpenAIHyperparameters()


class FineTuningJobError(_Response):
    code: str
    message: str
    param: str | None = None


class FineTuningJob(_Response):
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    id: str
    model: str
    created_at: int
    finished_at: int | None = None
    fine_tuned_model: str | None = Field(
        None, description="The trained model's id (`ft:<base>:<suffix or tenant>:<job id>`) once the job "
        "succeeded; `GET /jobs/{id}` gives its files' location as `artifact_path`.")
    organization_id: str
    result_files: list[str] = Field(default_factory=list)
    status: Literal["validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled"]
    training_file: str
    validation_file: str | None = None
    hyperparameters: dict[str, Any]
    method: dict[str, Any]
    trained_tokens: int | None = None
    error: FineTuningJobError | None = None
    seed: int
    estimated_finish: int | None = None
    integrations: list[Any] = Field(default_factory=list)
    metadata: dict[str, str] | None = None
    user_provided_suffix: str | None = None
    usage: dict[str, Any] | None = Field(
        None, description="An extension: worker and GPU hours used so far (spot and on-demand apart) and their "
        "cost, and `estimated_*` totals from validation (`GET /jobs/{id}` has them as `usage` and `estimate`).")


class FineTuningJobList(ListResponse):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class FineTuningJobEvent(_Response):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: str
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"] = "message"
    data: dict[str, Any] = Field(default_factory=dict)


class FineTuningJobEventList(ListResponse):
    object: Literal["list"] = "list"
    data: list[FineTuningJobEvent]
    has_more: bool


class FineTuningJobCheckpoint(_Response):
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    id: str
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, Any]
    step_number: int


class FineTuningJobCheckpointList(ListResponse):
    object: Literal["list"] = "list"
    data: list[FineTuningJobCheckpoint]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class Model(_Response):
    """A model this key can fine-tune from or use: a base model on the server, or a model a
    job of its tenant trained (`ft:` id)."""

    object: Literal["model"] = "model"
    id: str
    created: int = Field(description="Unix seconds: when the base model's files were written, or the job finished.")
    owned_by: str = Field(description="`system` for a base model, `org-<tenant>` for a fine-tuned one.")
    engine: Literal["vllm", "transformers"] | None = Field(
        None, description="Extension, base models only: the engine the model servers answer with, `vllm` (batching "
        "every request and adapter), or `transformers` for a model vLLM cannot load (one request at a time). A "
        "fine-tuned model is served by its base model's engine.")


class ModelList(ListResponse):
    object: Literal["list"] = "list"
    data: list[Model]


# -- Completions (`/v1/chat/completions`, `/v1/completions`) -------------------------------------

class TextPart(_Request):
    type: Literal["text"] = "text"
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(_Request):
    include_usage: bool = Field(False, description="A last chunk carries the usage counts.")


class _Sampling(_Request):
    model: str = Field(description="A base model's name or a fine-tuned model's `ft:` id (see GET /v1/models).")
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description="Most tokens to generate (default: the rest of "
                                   "the context, at most the server's default).")
    temperature: float = Field(1.0, ge=0, le=2, description="0 is greedy; higher samples more freely.")
    top_p: float = Field(1.0, gt=0, le=1, description="Sample from the smallest set of tokens whose "
                         "probability reaches top_p.")
    stop: str | list[str] | None = Field(None, description="Up to 4 strings that end the completion "
                                         "(not included in it).")
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, description="Sample reproducibly: the same seed "
                             "and request give the same text.")
    stream: bool = Field(False, description="Send the completion as server-sent events, piece by piece.")
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16, description="Choices to generate for the prompt (sampled in one batch).")
    user: str | None = Field(None, max_length=256)
    presence_penalty: float = Field(0.0, ge=0, le=0, description="Only 0 is supported.")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="Only 0 is supported.")

    @model_validator(mode="after")
    def _stops(self) -> _Sampling:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: give at most 4 non-empty strings")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionCreate(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000, description="The newer name of max_tokens.")
    logprobs: bool = Field(False, description="Return the log-probability of each generated token.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="With logprobs: also this many of the most likely "
                                     "tokens at each position.")

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionCreate:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: set logprobs to true to use top_logprobs")
        return self

    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionCreate(_Sampling):
    prompt: str | list[str] = Field(description="The text to continue (a list of one string is accepted).")
    logprobs: int | None = Field(None, ge=0, le=5, description="Return the log-probabilities of the generated "
                                 "tokens and of this many most likely ones at each position.")

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionCreate:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: give one prompt per request")
        return self

    def text(self) -> str:
        return self.prompt[0] if isinstance(self.prompt, list) else self.prompt


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class CompletionLogprobs(_Response):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class ChatChoice(_Response):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Response):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_Response):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# --- graders (/v1/fine_tuning/alpha/graders) -------------------------------------------------


class GraderValidateRequest(_Request):
    """OpenAI's `graders.validate`: the grader object (string_check, text_similarity, python,
    score_model, multi), checked as a reinforcement job's grader is."""

    grader: dict[str, Any]


class GraderRunRequest(_Request):
    """OpenAI's `graders.run`: a grader, a model's reply (`{{sample.output_text}}`; parsed as JSON
    for `{{sample.output_json}}` when it is JSON) and the dataset row it answers (`{{item.*}}`)."""

    grader: dict[str, Any]
    model_sample: str = Field(..., max_length=65536)
    item: Any = None


class GraderValidateResponse(_Response):
    grader: dict[str, Any]


class GraderRunResponse(_Response):
    """The reward, and per grader its scores and errors, as OpenAI answers."""

    reward: float
    metadata: dict[str, Any]
    sub_rewards: dict[str, Any]
    model_grader_token_usage_per_model: dict[str, Any]
