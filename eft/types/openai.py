"""Wire models of the OpenAI-compatible fine-tuning API (`/v1/fine_tuning/jobs`): the request
and object shapes of OpenAI's API, so its official clients work against this service.

Extensions beyond OpenAI's fields are accepted where they are needed to run on this service:
`hyperparameters.max_steps` and `hyperparameters.max_seq_len` (e.g. through the openai client's
`extra_body`, or as extra keys of `hyperparameters`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from eft.types._base import ListResponse, _Request, _Response

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


class OpenAIMethod(_Request):
    type: Literal["supervised"] = Field("supervised", description="Only supervised fine-tuning runs here.")
    supervised: Supervised = Field(default_factory=Supervised)


class FineTuningJobCreate(_Request):
    """OpenAI's create request; `model` is a base model this service knows (e.g. tiny-llama)."""

    model: str = Field(..., min_length=1, max_length=512, examples=["tiny-llama"])
    training_file: str = Field(..., min_length=1, max_length=2048, examples=["file-019a4f2c3b1d5e6f7a8b9c0d"])
    validation_file: str | None = Field(None, min_length=1, max_length=2048)
    hyperparameters: OpenAIHyperparameters | None = None
    method: OpenAIMethod | None = None
    suffix: str | None = Field(None, min_length=1, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    integrations: list[Any] | None = Field(None, max_length=0, description="Not supported: leave empty.")

    @property
    def resolved_hyperparameters(self) -> OpenAIHyperparameters:
        if self.method is not None:
            return self.method.supervised.hyperparameters
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
    status: Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled"]
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


class ModelList(ListResponse):
    object: Literal["list"] = "list"
    data: list[Model]
