"""Serving fine-tuned models: how soon a finished job answers, and the CPU backend's tokens/s
with 1 and 4 adapters loaded.

    .venv/bin/python bench/inference.py            # writes its section of BENCHMARKS.md

Part one goes through the whole service: a local Ray cluster, the service on Ray Serve with its
model servers at zero replicas, a 3-step LoRA job on the tiny Llama; from the moment the job
reads `succeeded` it streams a chat completion from the job's model id and takes the time to
the first token (a model server replica starts, loads the base model and the adapter), then
the same on the warm replica. Part two runs the model server's engine in this process: greedy
completions of a fixed length from a base model alone, from one adapter, and from four adapters
taken in turn (each request switches the active adapter), all in one run, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from recovery import machine  # noqa: E402
from report import replace_section  # noqa: E402

SECTION = "## Inference: from a finished job to chat"
MODELS = ROOT / "assets" / "models"
QUESTION = [{"role": "user", "content": "What is the first word of: frog fox high king"}]


def _first_token_s(url: str, key: str, model: str) -> tuple[float, float]:
    """Seconds to the first streamed token and to the end of the completion."""
    started = time.monotonic()
    first = None
    body = {"model": model, "messages": QUESTION, "max_tokens": 16, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                first = time.monotonic() - started
    return first or float("nan"), time.monotonic() - started


def through_the_service() -> dict[str, float]:
    import ray
    from ray import serve

    from eft.api.local import deploy_app, listen_ports, ray_node_env, wait_healthy

    home = Path(tempfile.mkdtemp(prefix="eft-bench-inference-"))
    dash_port, port = listen_ports(2)
    os.environ.update(ray_node_env(os.environ))
    ray.init(address="local", num_cpus=8, include_dashboard=True, dashboard_host="127.0.0.1",
             dashboard_port=dash_port, log_to_driver=False, configure_logging=False)
    key = "eft-bench-" + secrets.token_urlsafe(16)
    try:
        deploy_app({"EFT_HOME": str(home), "EFT_RAY_DASHBOARD_URL": f"http://127.0.0.1:{dash_port}",
                    "EFT_SCHEDULER_INTERVAL_S": "0.5", "EFT_ADMIN_API_KEY": key}, port)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        headers = {"Authorization": f"Bearer {key}"}
        job = httpx.post(f"{url}/jobs", headers=headers, timeout=60, json={
            "model": "tiny-llama", "training_file": "demo/chat_train.jsonl", "name": "bench",
            "hyperparameters": {"max_steps": 3, "global_batch_size": 4, "micro_batch_size": 4, "max_seq_len": 96},
        }).raise_for_status().json()
        while (job := httpx.get(f"{url}/jobs/{job['id']}", headers=headers).json())["status"] not in (
                "succeeded", "failed", "cancelled"):
            time.sleep(0.2)
        assert job["status"] == "succeeded", job["error"]
        cold_first, cold_total = _first_token_s(url, key, job["fine_tuned_model"])
        warm = [_first_token_s(url, key, job["fine_tuned_model"]) for _ in range(5)]
        base = [_first_token_s(url, key, "tiny-llama") for _ in range(5)]
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"cold_first": cold_first, "cold_total": cold_total,
            "warm_first": statistics.median(w[0] for w in warm), "warm_total": statistics.median(w[1] for w in warm),
            "base_first": statistics.median(b[0] for b in base)}


def _adapters(base: Path, root: Path, count: int) -> list[Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = []
    for i in range(count):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(base)
        peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                init_lora_weights=False))
        peft.save_pretrained(root / f"adapter-{i}")
        out.append(root / f"adapter-{i}")
    return out


def engine_throughput(family: str, tokens: int, rounds: int) -> dict[str, float]:
    """Generated tokens/s: base model alone, 1 adapter, 4 adapters in turn (interleaved rounds)."""
    from eft.service.serving.engine import AdapterSource, BaseSource, Request
    from eft.service.serving.hf_engine import Engine

    root = Path(tempfile.mkdtemp(prefix="eft-bench-adapters-"))
    paths = _adapters(MODELS / family, root, 4)
    engine = Engine(BaseSource(str(MODELS / family)), root / "cache", max_adapters=4)
    adapters = [AdapterSource(f"ft:{family}:bench:{i}", str(p)) for i, p in enumerate(paths)]
    request = Request(prompt="The cat sat on the mat and", max_tokens=tokens, temperature=0, ignore_eos=True)

    def rate(choices: list[AdapterSource | None]) -> float:
        produced, started = 0, time.perf_counter()
        for adapter in choices:
            *_, last = engine.stream(adapter, request, cancelled=None)
            assert last["usage"]["completion_tokens"] == tokens
            produced += tokens
        return produced / (time.perf_counter() - started)

    load_started = time.perf_counter()
    for adapter in adapters:  # first use of each: loaded from disk
        list(engine.stream(adapter, Request(prompt="x", max_tokens=1, temperature=0)))
    load_s = (time.perf_counter() - load_started) / len(adapters)
    results: dict[str, list[float]] = {"base": [], "one": [], "four": []}
    for _ in range(rounds):
        results["base"].append(rate([None] * 4))
        results["one"].append(rate([adapters[0]] * 4))
        results["four"].append(rate(adapters))
    assert engine.loaded() == [a.model for a in adapters]
    return {"load_s": load_s, **{k: statistics.median(v) for k, v in results.items()}}


def render(service: dict[str, float], engines: dict[str, dict[str, float]], tokens: int, elapsed: float) -> str:
    lines = [
        SECTION, "",
        f"`bench/inference.py`, {datetime.now().date()}, on {machine()}; {elapsed:.0f} s in all.", "",
        "### A finished job answers (through the service on a local Ray cluster)", "",
        "| measure | seconds |", "|---|---:|",
        f"| job `succeeded` -> first streamed chat token, model servers at zero replicas | {service['cold_first']:.2f} |",
        f"| ... to the end of that 16-token completion | {service['cold_total']:.2f} |",
        f"| warm replica, adapter loaded: request -> first token (median of 5) | {service['warm_first']:.3f} |",
        f"| warm replica: whole 16-token completion (median of 5) | {service['warm_total']:.3f} |",
        f"| warm replica, base model: request -> first token (median of 5) | {service['base_first']:.3f} |",
        "",
        "The cold figure is a new model server replica (a Ray worker process that imports torch, "
        "transformers and PEFT), the base model and the adapter loaded, and the completion: no "
        "restart and no deploy step.", "",
        f"### Tokens/s of the CPU backend ({tokens} greedy tokens per request, one request at a time)", "",
        "| base model | adapter first load (s) | base alone (tok/s) | 1 adapter (tok/s) | 4 adapters in turn (tok/s) "
        "| 1 adapter / base | 4 adapters / 1 adapter |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family, r in engines.items():
        lines.append(f"| {family} | {r['load_s']:.2f} | {r['base']:.0f} | {r['one']:.0f} | {r['four']:.0f} | "
                     f"{r['one'] / r['base']:.2f} | {r['four'] / r['one']:.2f} |")
    lines += ["",
              "Adapters are LoRA r=16 on every linear layer, unmerged (PEFT adds each adapter's product "
              "to the base layer's output), so an adapter costs its extra matmuls per token; taking "
              "another adapter per request costs PEFT's `set_adapter`, a walk over the model's LoRA "
              "layers. Rounds interleave the three cases; medians are shown. The bundled models are tiny, so these rates measure the "
              "per-token overhead of generate more than arithmetic.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    service = through_the_service()
    engines = {family: engine_throughput(family, args.tokens, args.rounds)
               for family in ("tiny-llama", "tiny-qwen3")}
    section = render(service, engines, args.tokens, time.perf_counter() - started)
    if not args.no_write:
        replace_section(args.output, SECTION, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
