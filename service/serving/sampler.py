"""A sampler for training: `n` completions per prompt with their token ids and log-probabilities,
from a base model or a named adapter, for a trainer's loop (reinforcement learning's rollouts,
evaluations). It is a Ray actor in the model servers' environment holding one vLLM engine
(service/serving/vllm_engine.py): the base model once, adapters loaded on first use, every
prompt's samples in one continuous batch. Its handle goes to Ray Train workers and Ray tasks
as any actor handle does.

    sampler = Sampler.start(BaseSource(path), EngineOptions(cache_dir=...))
    groups = ray.get(sampler.sample.remote([[1, 2, 3]], n=4, max_tokens=32, temperature=1.0, seed=7,
                                           adapter=AdapterSource("policy", "/ckpt/step-10", "checkpoint")))
    groups[0][0] == {"token_ids": [...], "logprobs": [...], "text": "...", "finish_reason": "stop"}

An adapter whose weights change is refreshed in place: sample from the same name with the new
location (a checkpoint the trainer just wrote), and the engine loads it under a new id before
those samples start; requests already running finish on the old weights. The log-probabilities
are the sampling distribution's (after temperature; top_p leaves them unchanged), per sampled token.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import ray

from eft.service.serving.engine import AdapterSource, BaseSource, EngineOptions, Request


@ray.remote
class _SamplerActor:
    def __init__(self, base: BaseSource, options: EngineOptions):
        self.base, self.options = base, dataclasses.replace(options, engine="vllm")
        self.engine: Any = None

    async def ready(self) -> dict[str, Any]:
        """Start (and warm up) the engine; its kind and the base model's context."""
        from eft.service.serving.engines import start_engine

        if self.engine is None:
            self.engine = await start_engine(self.base, self.options)
        return {"engine": self.engine.kind, "context": self.engine.context}

    async def sample(self, prompts: list[list[int]], n: int = 1, max_tokens: int = 256, temperature: float = 1.0,
                     top_p: float = 1.0, seed: int | None = None, adapter: AdapterSource | dict | None = None,
                     stop: list[str] | None = None, ignore_eos: bool = False) -> list[list[dict[str, Any]]]:
        """`n` samples of each prompt (token ids), all in one batch; prompt i samples with seed
        `seed + i` (None: unseeded); `adapter` an AdapterSource or its fields as a dict (a trainer,
        which imports nothing of the service's). Raises ValueError for a request the engine refuses."""
        await self.ready()
        if isinstance(adapter, dict):
            adapter = AdapterSource(**adapter)

        async def group(index: int, ids: list[int]) -> list[dict[str, Any]]:
            request = Request(prompt_ids=ids, n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              seed=None if seed is None else seed + index, stop=list(stop or []), logprobs=0,
                              ignore_eos=ignore_eos)
            samples = [{"token_ids": [], "logprobs": [], "text": "", "finish_reason": None} for _ in range(n)]
            async for item in self.engine.generate(adapter, request, max_tokens):
                if "error" in item:
                    raise ValueError(f"prompt {index}: {item['error']['message']}")
                if "usage" in item:
                    continue
                sample = samples[item["index"]]
                if "finish_reason" in item:
                    sample["finish_reason"] = item["finish_reason"]
                    continue
                sample["text"] += item["text"]
                sample["token_ids"] += item["token_ids"]
                sample["logprobs"] += [entry["logprob"] for entry in item["logprobs"]]
            return samples

        return list(await asyncio.gather(*(group(i, list(ids)) for i, ids in enumerate(prompts))))

    async def generating(self) -> int:
        """Requests the engine is still generating (a cancelled `sample` call's are aborted)."""
        return self.engine.generating() if self.engine is not None else 0

    async def adapters(self) -> list[str]:
        return self.engine.loaded() if self.engine is not None else []


class Sampler:
    """Starts the sampler actor in the model servers' environment."""

    @staticmethod
    def start(base: BaseSource, options: EngineOptions, python: str | None = None, num_cpus: float = 1,
              num_gpus: float = 0, env: dict[str, str] | None = None) -> Any:
        """The actor's handle, once its engine is up. `python`: the model servers' environment
        (default: engines.py:serving_python, e.g. the checkout's .venv-serve)."""
        from eft.service.serving.engines import serving_python

        runtime_env: dict[str, Any] = {"env_vars": dict(env or {})}
        python = python or serving_python(dict(env or {}))
        if python:
            runtime_env["py_executable"] = python
        actor = _SamplerActor.options(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env,
                                      max_concurrency=1000).remote(base, options)
        ray.get(actor.ready.remote())
        return actor
