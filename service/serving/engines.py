"""Which engine serves a base model (vLLM's, or transformers' as the fallback), started and warmed
up off the event loop, and which Python runs it (the model servers' own environment); and
`LocalModels`, the engines of one process (a server without Ray Serve, tests). The model server
replicas (api/inference.py) and the trainers' sampler (sampler.py) open theirs the same way."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, AsyncIterator

from eft.service.serving.engine import AdapterSource, BaseSource, EngineOptions, Request

log = logging.getLogger("eft.inference")


#: The model servers' environment `make setup` builds (deploy/install-serving.sh).
LOCAL_SERVING_VENV = Path(__file__).resolve().parents[2] / ".venv-serve"


def serving_python(env: dict[str, str]) -> str | None:
    """The Python the model servers run: `EFT_SERVING_PYTHON` (an image's vLLM environment; empty:
    the service's own, with transformers' engine only), else the checkout's `.venv-serve` when
    setup built it."""
    if "EFT_SERVING_PYTHON" in env:
        return env["EFT_SERVING_PYTHON"] or None
    local = LOCAL_SERVING_VENV / "bin" / "python"
    return str(local) if local.exists() else None


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def open_engine(base: BaseSource, options: EngineOptions) -> Any:
    """The engine for `base`: vLLM's where it is installed and loads the model, else the
    transformers fallback (with `engine="vllm"`, vLLM's or an error)."""
    if options.engine != "transformers" and vllm_installed():
        from eft.service.serving.vllm_engine import UnsupportedModel, VllmEngine

        try:
            return VllmEngine(base, options)
        except UnsupportedModel as exc:
            if options.engine == "vllm":
                raise
            log.warning("%s: %s; serving it with the transformers fallback engine", base.key, exc)
    elif options.engine == "vllm":
        raise RuntimeError("EFT_INFERENCE_ENGINE=vllm, but vLLM is not installed in the model server's environment "
                           "(build it with deploy/install-serving.sh; EFT_SERVING_PYTHON names its python)")
    from eft.service.serving.hf_engine import Engine

    return Engine(base, Path(options.cache_dir), options.max_adapters)


async def start_engine(base: BaseSource, options: EngineOptions) -> Any:
    """`open_engine` off the event loop, then its warm-up (the first batch of a vLLM engine on a
    CPU builds its kernels: seconds a user's first request would wait)."""
    engine = await asyncio.to_thread(open_engine, base, options)
    warm_up = getattr(engine, "warm_up", None)
    if warm_up is not None:
        await warm_up()
    return engine


class LocalModels:
    """Serves completions in this process (the engines a model server replica runs): for a
    single-process server without Ray Serve, and for tests."""

    def __init__(self, cache_dir: Path, max_adapters: int = 8, default_max_tokens: int = 512,
                 options: EngineOptions | None = None):
        self.options = options or EngineOptions(cache_dir=str(cache_dir), max_adapters=max_adapters,
                                                engine="transformers")
        self.default_max_tokens = default_max_tokens
        self.engines: dict[str, Any] = {}
        self._loading = asyncio.Lock()

    async def engine(self, base: BaseSource) -> Any:
        async with self._loading:
            if base.key not in self.engines:
                self.engines[base.key] = await start_engine(base, self.options)
        return self.engines[base.key]

    async def stream(self, base: BaseSource, adapter: AdapterSource | None,
                     request: Request) -> AsyncIterator[dict[str, Any]]:
        engine = await self.engine(base)
        async for item in engine.generate(adapter, request, self.default_max_tokens):
            yield item

