"""The model servers: a Ray Serve deployment that answers completions from base models and the
adapters trained on them, and the API's way of calling it.

`ModelServer` replicas load base models on demand through Serve's model multiplexing (keyed
by base model, at most `EFT_INFERENCE_BASE_MODELS_PER_REPLICA` per replica, least recently used
dropped), so the requests for one base model go to the replicas that hold it; each base model
is one engine (service/serving/engines.py: vLLM's, batching every request and adapter, or
transformers' as the fallback) carrying many adapters. The replicas run the model servers' own
Python environment (api/serve_config.py:model_server). The deployment autoscales on ongoing requests
and down to zero replicas when idle; a request that finds none waits while one starts.

The API replica calls it through a deployment handle (`ServeModels`); it imports nothing of
torch or transformers: the engine is imported in the model server replica only.
"""

from __future__ import annotations

import asyncio
import weakref
import dataclasses
from typing import Any, AsyncIterator

from ray import serve

from eft.service.errors import ServiceError
from eft.service.serving.engine import AdapterSource, BaseSource, InferenceError, Request



class ModelsUnavailable(ServiceError):
    status_code = 503
    type = "server_error"
    code = "model_server_starting"

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message, param="model")
        self.headers = {"Retry-After": str(retry_after_s)}


# The defaults api/serve_config.py:model_server gives (every deployment passes its own options).
@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64,
                  autoscaling_config={"min_replicas": 0, "initial_replicas": 0, "max_replicas": 1,
                                      "target_ongoing_requests": 32, "downscale_delay_s": 300})
class ModelServer:
    def __init__(self) -> None:
        from eft.service import credentials, jsonlog
        from eft.service.serving.engine import EngineOptions
        from eft.service.settings import get_settings

        jsonlog.configure()
        credentials.load()
        self.settings = get_settings()
        self.options = EngineOptions.from_settings(self.settings)
        self.sources: dict[str, BaseSource] = {}
        self.opened: weakref.WeakSet[Any] = weakref.WeakSet()

        async def load(key: str) -> Any:
            from eft.service.serving.engines import start_engine

            engine = await start_engine(self.sources[key], self.options)
            self.opened.add(engine)
            return engine

        # Base models one replica holds at once: the count its memory is split between.
        self.engine = serve.multiplexed(max_num_models_per_replica=self.options.base_models)(load)

    def check_health(self) -> None:
        """An engine whose vLLM process died fails the replica's health check: Serve replaces the
        replica instead of answering every later request with the dead engine's error."""
        dead = [engine.base.key for engine in list(self.opened) if getattr(engine, "errored", False)]
        if dead:
            raise RuntimeError(f"the vLLM engine of {dead} died: this replica is replaced")

    async def generate(self, base: dict[str, Any], adapter: dict[str, Any] | None,
                       request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """{"accepted"} at once (the caller's sign that a replica has the request), then what
        the engine streams (service/serving/engine.py)."""
        yield {"accepted": True}
        source = BaseSource(**base)
        self.sources[source.key] = source
        try:
            engine = await self.engine(source.key)
        except InferenceError as exc:  # a base model the replica has no room for: what to change
            yield {"error": exc.as_dict()}
            return
        except Exception as exc:  # noqa: BLE001 - the caller gets it as a 500 in the envelope
            yield {"error": {"status": 500, "code": "model_load_failed", "param": "model",
                             "message": f"the model server could not load {source.key}: {type(exc).__name__}: {exc}"}}
            return
        async for item in engine.generate(AdapterSource(**adapter) if adapter else None, Request(**request),
                                          self.settings.inference_default_max_tokens):
            yield item


class ServeModels:
    """The API's side: one streaming call per completion, routed to a replica holding the
    base model. Raises ModelsUnavailable (503) when no replica takes the request within
    `start_timeout_s` (one is starting: scale from zero, or a new node)."""

    def __init__(self, handle: Any, start_timeout_s: float, retry_after_s: int):
        self.handle, self.start_timeout_s, self.retry_after_s = handle, start_timeout_s, retry_after_s

    async def stream(self, base: BaseSource, adapter: AdapterSource | None,
                     request: Request) -> AsyncIterator[dict[str, Any]]:
        responses = self.handle.options(multiplexed_model_id=base.key, stream=True).generate.remote(
            dataclasses.asdict(base), dataclasses.asdict(adapter) if adapter else None, dataclasses.asdict(request))
        try:
            await asyncio.wait_for(responses.__anext__(), self.start_timeout_s)
        except asyncio.TimeoutError:
            responses.cancel()
            raise ModelsUnavailable(
                f"no model server took the request within {self.start_timeout_s:g} s (one is starting); "
                f"retry after {self.retry_after_s} s", self.retry_after_s) from None
        try:
            async for item in responses:
                yield item
        finally:
            responses.cancel()
