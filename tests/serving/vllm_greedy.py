"""Greedy completions from the model servers' vLLM engine, run with the model servers' Python
(.venv-serve/bin/python): the other side of tests/serving/test_vllm_conformance.py, which
compares them with transformers + PEFT in the service's environment.

    .venv-serve/bin/python tests/serving/vllm_greedy.py IN.json OUT.json

IN holds {"max_tokens", "cache_dir", "families": [{"name", "path", "messages": [[...]],
"prompts": [[ids]], "adapters": [{"model", "location", "kind"}]}]}. Each family gets one
`VllmEngine` (the product's class); every prompt is asked of the base model and of each adapter at
once (one continuous batch mixing them); a family given no adapters has its chats rendered
only. OUT holds per family the engine's start time, the
prompts as this environment's transformers renders `messages`, and the completions' token ids
per model ("" the base), or the reason vLLM does not serve the family; and the refusal of a base
model given more than a replica holds (`too_small`: {"path", "host_memory_gb"}).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def _family(spec: dict, max_tokens: int, cache_dir: str) -> dict:
    from transformers import AutoTokenizer

    from eft.service.serving.engine import AdapterSource, BaseSource, EngineOptions, Request, prompt_ids
    from eft.service.serving.vllm_engine import UnsupportedModel, VllmEngine

    if not spec["adapters"]:  # the chat template only: rendered by this environment's transformers
        tokenizer = AutoTokenizer.from_pretrained(spec["path"])
        return {"rendered": [prompt_ids(tokenizer, Request(messages=m)) for m in spec["messages"]]}
    started = time.monotonic()
    try:
        engine = await asyncio.to_thread(VllmEngine, BaseSource(spec["path"]), EngineOptions(
            # Two slots for the two adapters: every slot holds one, the batch where vLLM's CPU ops
            # gave base-model rows the last slot's adapter (service/serving/vllm_plugin.py).
            cache_dir=cache_dir, max_lora_rank=8, adapters_per_batch=2, max_model_len=512))
    except UnsupportedModel as exc:
        return {"unsupported": str(exc)}
    result: dict = {"start_s": time.monotonic() - started,
                    "rendered": [prompt_ids(engine.tokenizer, Request(messages=m)) for m in spec["messages"]]}

    async def complete(adapter: dict | None, ids: list[int]) -> list[int]:
        request = Request(prompt_ids=ids, max_tokens=max_tokens, temperature=0)
        tokens: list[int] = []
        async for item in engine.generate(AdapterSource(**adapter) if adapter else None, request, max_tokens):
            if "error" in item:
                raise RuntimeError(item["error"])
            tokens += item.get("token_ids", [])
        return tokens

    models = [None, *spec["adapters"]]
    started = time.monotonic()
    outputs = await asyncio.gather(*[complete(a, ids) for a in models for ids in spec["prompts"]])
    result["generate_s"] = time.monotonic() - started
    per = len(spec["prompts"])
    result["outputs"] = {(a["model"] if a else ""): outputs[i * per:(i + 1) * per] for i, a in enumerate(models)}
    result["stop_ids"] = engine.stop_ids
    engine.engine.shutdown()
    return result


async def main(source: str, target: str) -> None:
    spec = json.loads(open(source).read())
    results = {}
    # Two engines start at once: a start is mostly two processes importing vLLM, one core each.
    starting = asyncio.Semaphore(2)

    async def one(family: dict) -> None:
        async with starting:
            results[family["name"]] = await _family(family, spec["max_tokens"], spec["cache_dir"])
        print(family["name"], {k: v for k, v in results[family["name"]].items() if k.endswith("_s")}, flush=True)

    await asyncio.gather(*(one(family) for family in spec["families"]))
    # Whether vLLM here serves each of the given models with LoRA (no engine started).
    from eft.service.serving.engine import BaseSource
    from eft.service.serving.vllm_engine import UnsupportedModel, VllmEngine, _supports

    results["_support"] = {}
    for model in spec.get("support", []):
        try:
            _supports(model["path"])
            results["_support"][model["name"]] = None
        except UnsupportedModel as exc:
            results["_support"][model["name"]] = str(exc)
    # A base model larger than what the replica holds is refused before vLLM starts anything.
    if "too_small" in spec:
        from eft.service.serving.engine import EngineOptions, InferenceError

        try:
            VllmEngine(BaseSource(spec["too_small"]["path"]), EngineOptions(
                cache_dir=spec["cache_dir"], host_memory_gb=spec["too_small"]["host_memory_gb"], base_models=2))
            results["_too_small"] = None
        except InferenceError as exc:
            results["_too_small"] = exc.as_dict()
    with open(target, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
