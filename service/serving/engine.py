"""Completions from a base model and the adapters trained on it: what every engine of the model
servers shares (api/inference.py serves them on Ray Serve; engines.py:LocalModels in-process).

Two engines answer, behind one stream:
- vllm_engine.py, vLLM's async engine: continuous batching across requests and tenants, many
  adapters on one base in one batch. It is the engine of every model vLLM loads.
- hf_engine.py, transformers' `generate`, one request at a time: the fallback for a base model
  vLLM cannot load (its architecture is not one of vLLM's, or no vLLM is installed where the
  model server runs).
engines.py:open_engine picks one per base model (EFT_INFERENCE_ENGINE: auto, vllm or transformers).

A request is rendered as training rendered its records: chat messages through the base model's
own chat template (training/chat.py) with the job's `system_message` handling, tokens without
added special tokens; a plain prompt with them. An engine's `generate(adapter, request,
default_max_tokens)` yields, for each of the request's `n` choices, text deltas
({"index", "text", "token_ids", "logprobs"?}) and one {"index", "finish_reason"}, then one
{"usage"}; a request it refuses is a single {"error": {status, code, message, param}} item
before anything else. Closing the stream (a client that went away) stops the generation.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("eft.inference")

#: Files of a checkpoint a server needs (the optimizer state is not one of them).
CHECKPOINT_FILES = ("trainable.safetensors", "adapter/adapter_config.json")
ENGINES = ("auto", "vllm", "transformers")
#: The adapter's name in a checkpoint's parameter names (`...lora_A.default.weight`).
CHECKPOINT_ADAPTER_NAME = re.compile(r"\.default(?=\.)")


class InferenceError(Exception):
    """A request the engine refuses: `status` is the HTTP status it answers with."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "code": self.code, "message": self.message, "param": self.param}


@dataclass(frozen=True)
class BaseSource:
    """Where a base model loads from: its directory, or a pinned hub snapshot."""

    path: str
    hub: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        if self.hub:
            return f"hf:{self.hub['repo_id']}@{self.hub['revision']}"
        return self.path


@dataclass(frozen=True)
class AdapterSource:
    """A fine-tuned model: its id, where its files are, and whether that is the published
    adapter ("artifact") or a checkpoint. An engine holding `model` from another location
    loads it again (a sampler's adapter whose weights changed)."""

    model: str
    location: str
    kind: str = "artifact"


@dataclass
class Request:
    """One completion: chat `messages`, a text `prompt` or `prompt_ids` (tokens, for a trainer's
    sampler), and OpenAI's sampling parameters."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    #: Log-probabilities of the sampled tokens and this many most likely ones (None: none).
    logprobs: int | None = None
    system_message: str = "keep"
    #: Who asks (the metrics' label; the API's limits are per tenant already).
    tenant: str = ""
    #: Generate exactly max_tokens, past any end of sequence (benchmarks, as vLLM's ignore_eos).
    ignore_eos: bool = False


def adapter_config_dir(adapter: "AdapterSource", directory: Path) -> Path:
    """Where the adapter's `adapter_config.json` is among its files (a checkpoint keeps it under
    `adapter/`). Raises InferenceError (409) when there is none: a full fine-tuning job's model,
    or a checkpoint an older version wrote."""
    config_dir = directory / "adapter" if adapter.kind == "checkpoint" else directory
    if (config_dir / "adapter_config.json").is_file():
        return config_dir
    if adapter.kind == "checkpoint":
        raise InferenceError(409, "checkpoint_not_servable",
                             f"checkpoint {adapter.model} holds no adapter config (it was written by an older "
                             "version, or by a full fine-tuning job): sample the job's final model", "model")
    raise InferenceError(409, "model_not_servable",
                         f"{adapter.model} is not a LoRA adapter (a full fine-tuning job's model): download it "
                         "and serve it as a base model", "model")


def context_length(config: Any, tokenizer: Any) -> int:
    """The longest sequence (prompt + completion) the model takes."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else 2048


def prompt_ids(tokenizer: Any, request: Request) -> list[int]:
    """The prompt's tokens, as training tokenized records of its kind. Raises InferenceError
    (400) for messages the template refuses or a prompt with no tokens."""
    from eft.training.chat import TemplateError, prepare_messages, render

    param = "messages" if request.messages is not None else "prompt"
    if request.prompt_ids is not None:
        ids = list(request.prompt_ids)
    elif request.messages is not None:
        try:
            text = render(tokenizer, prepare_messages(request.messages, request.system_message),
                          add_generation_prompt=True)
        except TemplateError as exc:
            raise InferenceError(400, exc.rule, str(exc), "messages") from None
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tokenizer(request.prompt or "", add_special_tokens=True)["input_ids"])
    if not ids:
        raise InferenceError(400, "empty_prompt", "the prompt has no tokens: give some text to continue", param)
    return ids


def budget(context: int, request: Request, prompt_tokens: int, default_max_tokens: int) -> int:
    """The completion's token budget. Raises InferenceError (400) when prompt and budget exceed
    the model's context."""
    param = "messages" if request.messages is not None else "prompt"
    room = context - prompt_tokens
    if request.max_tokens is not None and request.max_tokens > room:
        raise InferenceError(
            400, "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + request.max_tokens} tokens ({prompt_tokens} in the {param}, "
            f"{request.max_tokens} in the completion). Please reduce the length of the {param} or "
            "the completion.", param)
    if room <= 0:
        raise InferenceError(
            400, "context_length_exceeded",
            f"This model's maximum context length is {context} tokens; the {param} has "
            f"{prompt_tokens}. Please reduce the length of the {param}.", param)
    return request.max_tokens if request.max_tokens is not None else min(room, default_max_tokens)


def held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could begin a stop string: they wait for the
    next piece before they are sent."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def first_stop(text: str, stops: list[str], start: int = 0) -> int | None:
    """Where the first stop string in `text` begins (searching from `start`), or None."""
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


@dataclass(frozen=True)
class EngineOptions:
    """How a model server builds its engines (the serving settings, as plain values a replica in
    another environment can take)."""

    cache_dir: str
    max_adapters: int = 8
    engine: str = "auto"
    max_lora_rank: int = 64
    adapters_per_batch: int = 4
    max_model_len: int = 4096
    kv_cache_gb: float = 1.0
    gpu_memory_utilization: float = 0.85
    #: What the replica holds (api/serve_config.py:model_server): GPUs (a fraction of one shares
    #: it), its node's memory in GB (None: not reserved), and the base models it may hold at once.
    gpu_share: float = 1.0
    host_memory_gb: float | None = None
    base_models: int = 2

    @classmethod
    def from_settings(cls, settings: Any, env: Mapping[str, str] | None = None) -> "EngineOptions":
        env = os.environ if env is None else env
        memory = env.get("EFT_INFERENCE_MEMORY_GB")
        return cls(gpu_share=float(env.get("EFT_INFERENCE_GPUS") or 1) or 1.0,
                   host_memory_gb=float(memory) if memory else None,
                   base_models=int(env.get("EFT_INFERENCE_BASE_MODELS_PER_REPLICA") or 2),
                   cache_dir=str(settings.home / "cache" / "models"), max_adapters=settings.inference_max_adapters,
                   engine=settings.inference_engine, max_lora_rank=settings.inference_max_lora_rank,
                   adapters_per_batch=settings.inference_adapters_per_batch,
                   max_model_len=settings.inference_max_model_len, kv_cache_gb=settings.inference_kv_cache_gb,
                   gpu_memory_utilization=settings.inference_gpu_memory_utilization)
