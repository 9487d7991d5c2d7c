"""One model server engine under concurrent chat requests: output tokens/s and time to first token.
Run by bench/inference.py with each environment's Python (the engines live in different ones):

    .venv-serve/bin/python bench/serving_load.py --engine vllm --model DIR --adapters A,B,C,D OUT.json
    .venv/bin/python bench/serving_load.py --engine transformers --model DIR --adapters A,B,C,D OUT.json

Each scenario sends `--concurrent` chat requests at once, each for exactly `--tokens` greedy tokens:
"base" all to the base model, "mixed" cycling over the base model and the adapters. Every adapter
is loaded (one short request each) before anything is timed: this measures batching, not loading.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

QUESTIONS = ["hello there", "What is the first word of: frog fox high king", "Count to five.", "Name a colour.",
             "Say something about the sea", "Why is the sky blue?", "Tell me a story about a cat.", "What is 2+2?"]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _scenario(models, base, adapters: list, concurrent: int, tokens: int) -> dict[str, float]:
    from eft.service.serving.engine import Request

    async def one(i: int) -> tuple[float, int]:
        adapter = adapters[i % len(adapters)]
        request = Request(messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], max_tokens=tokens,
                          temperature=0, ignore_eos=True)
        first, count = None, 0
        async for item in models.stream(base, adapter, request):
            if "error" in item:
                raise RuntimeError(item["error"])
            if item.get("text") and first is None:
                first = time.perf_counter() - started
            if "usage" in item:
                count = item["usage"]["completion_tokens"]
        return first if first is not None else float("nan"), count

    started = time.perf_counter()
    results = await asyncio.gather(*[one(i) for i in range(concurrent)])
    wall = time.perf_counter() - started
    firsts = [r[0] for r in results]
    produced = sum(r[1] for r in results)
    assert produced == concurrent * tokens, (produced, concurrent * tokens)
    return {"tok_s": produced / wall, "wall_s": wall, "ttft_p50": statistics.median(firsts),
            "ttft_p99": _quantile(firsts, 0.99)}


async def main(args: argparse.Namespace) -> dict:
    from eft.service.serving.engine import AdapterSource, BaseSource, EngineOptions, Request
    from eft.service.serving.engines import LocalModels

    options = EngineOptions(cache_dir=str(Path(args.out).parent / f"cache-{args.engine}"), engine=args.engine,
                            max_adapters=8, max_lora_rank=16, adapters_per_batch=4, max_model_len=1024)
    models = LocalModels(Path(options.cache_dir), options=options, default_max_tokens=args.tokens)
    base = BaseSource(args.model)
    started = time.perf_counter()
    engine = await models.engine(base)
    start_s = time.perf_counter() - started
    adapters = [AdapterSource(f"ft:bench:{i}", path) for i, path in enumerate(args.adapters.split(","))]
    for adapter in adapters:
        async for _ in models.stream(base, adapter, Request(prompt="x", max_tokens=1, temperature=0)):
            pass
    rounds: dict[str, list[dict]] = {"base": [], "mixed": []}
    for _ in range(args.rounds):
        rounds["base"].append(await _scenario(models, base, [None], args.concurrent, args.tokens))
        rounds["mixed"].append(await _scenario(models, base, [None, *adapters], args.concurrent, args.tokens))
    result = {"engine": getattr(engine, "kind", "transformers"), "start_s": start_s}
    for name, runs in rounds.items():  # the median round by throughput
        result[name] = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=("vllm", "transformers"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--adapters", required=True)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("out")
    arguments = parser.parse_args()
    outcome = asyncio.run(main(arguments))
    Path(arguments.out).write_text(json.dumps(outcome))
    print(json.dumps(outcome), flush=True)
    # Leave without the interpreter's teardown: an engine's threads and processes can abort it
    # after the result is written (vLLM's engine process is ended by its own finalizer).
    import os

    os._exit(0)
