"""The fallback engine: completions with transformers' `generate`, for a base model vLLM cannot
load (service/serving/vllm_engine.py is the engine of everything it can; engine.py:open_engine
chooses). It runs in the model server's environment and in the service's alike.

An `Engine` holds one base model's weights once and many LoRA adapters on top of them (PEFT's
multi-adapter model). An adapter is loaded on first use, from any storage the service writes
to (a directory or an object store), and the least recently used one is dropped when more than
`max_adapters` are loaded. A job's published artifact is a PEFT adapter directory; a checkpoint
holds the trainable weights by parameter name beside the adapter's config, and is loaded into a
fresh adapter of that config.

Generation is `generate` (greedy at temperature 0, else sampling with `top_p`), streamed as text
deltas; it stops at the model's end-of-sequence or end-of-turn token, at a `stop` string (never
part of the text, as OpenAI's), at `max_tokens`, or when the caller goes away. One generation
runs at a time per engine, since the active adapter is the model's state; `n` choices are
generated one after another, and token log-probabilities are the vLLM engine's only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

from eft.service.serving.engine import (
    CHECKPOINT_ADAPTER_NAME, CHECKPOINT_FILES, AdapterSource, BaseSource, InferenceError, Request, adapter_config_dir, budget, context_length, first_stop, held_back,
    prompt_ids,
)
from eft.service.serving.fetch import fetch

log = logging.getLogger("eft.inference")



class Engine:
    """One base model and the adapters loaded on it (see the module docstring)."""

    kind = "transformers"

    def __init__(self, base: BaseSource, cache_dir: Path, max_adapters: int = 8,
                 device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from eft.training.chat import stop_token_ids
        from eft.training.model import hub_path

        # A folder of this engine's own: the copies in it are deleted with the adapters.
        self.cache_dir = Path(cache_dir) / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # Deleted once the engine is gone: when Serve drops the base model from the replica,
        # requests still generating keep it (no __del__: Serve would call that at once).
        weakref.finalize(self, shutil.rmtree, str(self.cache_dir), True)
        self.base, self.max_adapters = base, max(1, max_adapters)
        path = hub_path(base.hub) if base.hub else base.path
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()
        self.context = context_length(self.model.config, self.tokenizer)
        self.stop_ids = set(stop_token_ids(self.tokenizer, self.model.generation_config))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.stop_ids, default=0)
        self.peft: Any = None
        self.adapters: OrderedDict[str, str] = OrderedDict()  # model id -> PEFT adapter name
        self._names = 0
        self.copies: dict[str, Path] = {}  # adapter name -> its files copied under cache_dir
        self.lock = threading.Lock()
        log.info("loaded %s on %s (%s, context %d)", base.key, self.device, dtype, self.context)

    # -- adapters ---------------------------------------------------------------------------
    def _load_adapter(self, adapter: AdapterSource) -> str:
        self._names += 1
        name = f"a{self._names}"
        try:
            directory, copied = fetch(adapter.location, self.cache_dir,
                                       CHECKPOINT_FILES if adapter.kind == "checkpoint" else None)
        except FileNotFoundError:
            raise InferenceError(404, "model_not_found", f"the files of {adapter.model} are gone (a checkpoint the "
                                 "job pruned since): list the kept ones with GET /jobs/{id}/checkpoints",
                                 "model") from None
        try:
            self._load_files(adapter, name, directory)
        except BaseException:
            if copied:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        if copied:
            self.copies[name] = directory
        self.peft.to(self.device).eval()
        return name

    def _load_files(self, adapter: AdapterSource, name: str, directory: Path) -> None:
        """Add adapter `name` from its files: its config injects its layers, then its weights
        load into them. Whatever fails after the injection takes the adapter out again, so
        the model is as it was (a half-loaded adapter never answers, nor stays in memory)."""
        from peft import LoraConfig, PeftModel

        checkpoint = adapter.kind == "checkpoint"
        config_dir = adapter_config_dir(adapter, directory)
        config = LoraConfig.from_pretrained(str(config_dir))
        config.inference_mode = True
        if self.peft is None:
            self.peft = PeftModel(self.model, config, adapter_name=name)
        else:
            self.peft.add_adapter(name, config)
        try:
            if checkpoint:
                self._load_trainable(directory / CHECKPOINT_FILES[0], name)
            else:
                self._load_adapter_weights(directory, name)
        except BaseException:
            self.peft.delete_adapter(name)
            raise

    def _load_adapter_weights(self, directory: Path, name: str) -> None:
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft, load_peft_weights(str(directory), device="cpu"),
                                           adapter_name=name)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise InferenceError(409, "model_not_servable",
                                 f"the adapter's weights do not fit its config ({unexpected[:3]})", "model")

    def _load_trainable(self, path: Path, name: str) -> None:
        import torch

        from eft.training.checkpoint import load_trainable

        state = load_trainable(path.parent)
        params = dict(self.peft.named_parameters())
        renamed = {CHECKPOINT_ADAPTER_NAME.sub(f".{name}", key): value for key, value in state.items()}
        unknown = [key for key in renamed if key not in params]
        missing = [key for key in params if f".{name}." in key and key not in renamed]
        if unknown or missing:
            raise InferenceError(409, "checkpoint_not_servable",
                                 f"the checkpoint's weights do not fit its adapter config ({(unknown or missing)[:3]})",
                                 "model")
        with torch.no_grad():
            for key, value in renamed.items():
                params[key].copy_(value.to(params[key].dtype))

    def _select(self, adapter: AdapterSource | None) -> None:
        """Make `adapter` (None: the base model) the active one, loading it if needed."""
        if adapter is None:
            return
        if adapter.model in self.adapters:
            self.adapters.move_to_end(adapter.model)
        else:
            self.adapters[adapter.model] = self._load_adapter(adapter)
            while len(self.adapters) > self.max_adapters:
                _, old = self.adapters.popitem(last=False)
                self.peft.delete_adapter(old)
                if old in self.copies:
                    shutil.rmtree(self.copies.pop(old), ignore_errors=True)
                log.info("dropped adapter %s from %s (least recently used)", old, self.base.key)
        self.peft.set_adapter(self.adapters[adapter.model])

    def loaded(self) -> list[str]:
        return list(self.adapters)


    # -- requests ---------------------------------------------------------------------------
    def prompt_ids(self, request: Request) -> list[int]:
        return prompt_ids(self.tokenizer, request)

    def budget(self, request: Request, prompt_tokens: int, default_max_tokens: int) -> int:
        return budget(self.context, request, prompt_tokens, default_max_tokens)

    def stream(self, adapter: AdapterSource | None, request: Request, default_max_tokens: int = 512,
               cancelled: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """Text deltas ({"text"}) and then one {"finish_reason", "usage"}. Raises
        InferenceError before the first delta for a request it refuses. Closing the iterator
        stops the generation."""
        ids = self.prompt_ids(request)
        max_tokens = self.budget(request, len(ids), default_max_tokens)
        cancelled = cancelled or threading.Event()
        with self.lock:
            if cancelled.is_set():  # the caller left while it waited its turn
                return
            self._select(adapter)
            yield from self._generate(adapter, ids, max_tokens, request, cancelled)

    def _generate(self, adapter: AdapterSource | None, ids: list[int], max_tokens: int, request: Request,
                  cancelled: threading.Event) -> Iterator[dict[str, Any]]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        class _Cancelled(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return torch.full((input_ids.shape[0],), cancelled.is_set(), dtype=torch.bool,
                                  device=input_ids.device)

        model = self.peft if self.peft is not None else self.model
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        sampling = request.temperature > 0
        kwargs: dict[str, Any] = dict(
            input_ids=torch.tensor([ids], device=self.device),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=self.device),
            max_new_tokens=max_tokens, min_new_tokens=max_tokens if request.ignore_eos else 0, do_sample=sampling,
            eos_token_id=sorted(self.stop_ids), pad_token_id=self.pad_id, streamer=streamer,
            stopping_criteria=StoppingCriteriaList([_Cancelled()]),
        )
        if sampling:
            kwargs.update(temperature=request.temperature, top_p=request.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        result: dict[str, Any] = {}

        def run() -> None:
            context = (self.peft.disable_adapter() if adapter is None and self.peft is not None
                       else contextlib.nullcontext())
            try:
                with context, torch.inference_mode():
                    if request.seed is not None:
                        torch.manual_seed(request.seed)
                    result["sequences"] = model.generate(**kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the reading side
                result["error"] = exc
                streamer.on_finalized_text("", stream_end=True)

        thread = threading.Thread(target=run, name="eft-generate", daemon=True)
        thread.start()
        text, sent, stopped = "", 0, False
        try:
            for piece in streamer:
                text += piece
                cut = first_stop(text, request.stop, max(0, sent - 1))
                if cut is not None:
                    if cut > sent:
                        yield {"text": text[sent:cut]}
                    sent, stopped = cut, True
                    cancelled.set()
                    break
                ready = len(text) - held_back(text, request.stop)
                if ready > sent:
                    yield {"text": text[sent:ready]}
                    sent = ready
        finally:
            cancelled.set()
            thread.join()
        if "error" in result:
            raise result["error"]
        if not stopped and len(text) > sent:
            yield {"text": text[sent:]}
        generated = result["sequences"][0, len(ids):].tolist()
        if stopped or (generated and generated[-1] in self.stop_ids):
            reason = "stop"
        else:
            reason = "length" if len(generated) >= max_tokens else "stop"
        yield {"finish_reason": reason,
               "usage": {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                         "total_tokens": len(ids) + len(generated)}}

    async def generate(self, adapter: AdapterSource | None, request: Request,
                       default_max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        """The engines' common stream (engine.py): each choice's text deltas and its finish
        reason, then the usage; a refusal is one {"error"} item."""
        if request.logprobs is not None:
            yield {"error": InferenceError(
                400, "logprobs_not_supported",
                f"{self.base.key} is served by the transformers fallback engine (vLLM cannot load it), which "
                "returns no log-probabilities: leave logprobs out", "logprobs").as_dict()}
            return
        prompt = completion = 0
        for index in range(request.n):
            choice = request if request.seed is None else _with_seed(request, request.seed + index)
            async for item in astream(self, adapter, choice, default_max_tokens):
                if "error" in item:
                    yield item
                    return
                if "text" in item:
                    yield {"index": index, "text": item["text"]}
                else:
                    yield {"index": index, "finish_reason": item["finish_reason"]}
                    prompt = item["usage"]["prompt_tokens"]
                    completion += item["usage"]["completion_tokens"]
        yield {"usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}}


def _with_seed(request: Request, seed: int) -> Request:
    import dataclasses

    return dataclasses.replace(request, seed=seed)


_DONE = object()


async def astream(engine: Engine, adapter: AdapterSource | None, request: Request,
                  default_max_tokens: int) -> AsyncIterator[dict[str, Any]]:
    """`engine.stream` for an event loop: the generation runs on its own thread, which hands
    each item over; a refusal or failure becomes one {"error"} item. When the consumer stops
    early (a client that went away), the generation stops at its next token."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    cancelled = threading.Event()

    def produce() -> None:
        try:
            with contextlib.closing(engine.stream(adapter, request, default_max_tokens, cancelled)) as items:
                for item in items:
                    loop.call_soon_threadsafe(queue.put_nowait, item)
                    if cancelled.is_set():
                        break
        except InferenceError as exc:
            loop.call_soon_threadsafe(queue.put_nowait, {"error": exc.as_dict()})
        except Exception as exc:  # noqa: BLE001 - reported to the caller, logged here
            log.exception("generation failed on %s", engine.base.key)
            loop.call_soon_threadsafe(queue.put_nowait, {"error": {
                "status": 500, "code": "generation_failed", "param": None,
                "message": f"the model server failed on this request ({type(exc).__name__}: {exc})"}})
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    threading.Thread(target=produce, name="eft-completion", daemon=True).start()
    try:
        while (item := await queue.get()) is not _DONE:
            yield item
    finally:
        cancelled.set()


