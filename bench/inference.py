"""Serving fine-tuned models: how soon a finished job answers, and what the model servers' engines
deliver under 32 concurrent chats (vLLM against transformers' generate).

    .venv/bin/python bench/inference.py            # writes its section of BENCHMARKS.md

Part one goes through the whole service: a local Ray cluster, the service on Ray Serve with its
model servers at zero replicas, a 3-step LoRA job on the tiny Llama; from the moment the job
reads `succeeded` it streams a chat completion from the job's model id and takes the time to
the first token (a model server replica starts, loads the base model and the adapter), then
the same on the warm replica. Part two (first in the run) loads each engine in its own
environment (bench/serving_load.py) and sends it 32 chat requests at once, on the base model and
mixing the base and four adapters: output tokens/s and time to the first token.
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


def small_llama(root: Path) -> Path:
    """A ~25M-parameter Llama (random weights, the tiny Llama's tokenizer and chat template): big
    enough that arithmetic, not Python's per-token overhead, sets a step's time, as it does for
    every model a user serves."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = root / "small-llama"
    tiny = MODELS / "tiny-llama"
    config = LlamaConfig.from_pretrained(tiny)
    config.update({"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 64})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    for name in tiny.iterdir():
        if name.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(name, out / name.name)
    return out


def engines_under_load(family: str, tokens: int, concurrent: int, rounds: int) -> dict[str, dict]:
    """bench/serving_load.py with each engine in its own environment: the same model, adapters,
    requests and machine, one after the other."""
    import subprocess

    root = Path(tempfile.mkdtemp(prefix="eft-bench-serving-"))
    model = small_llama(root) if family == "small-llama" else MODELS / family
    adapters = ",".join(str(p) for p in _adapters(model, root, 4))
    results = {}
    for engine, python in (("vllm", ROOT / ".venv-serve" / "bin" / "python"), ("transformers", Path(sys.executable))):
        out = root / f"{engine}.json"
        subprocess.run([str(python), str(ROOT / "bench" / "serving_load.py"), "--engine", engine, "--model",
                        str(model), "--adapters", adapters, "--tokens", str(tokens), "--concurrent",
                        str(concurrent), "--rounds", str(rounds), str(out)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        results[engine] = json.loads(out.read_text())
        assert results[engine]["engine"] == engine, results[engine]
    return results


def render(service: dict[str, float], engines: dict[str, dict], tokens: int, concurrent: int, elapsed: float) -> str:
    lines = [
        SECTION, "",
        f"`bench/inference.py`, {datetime.now().date()}, on {machine()}; {elapsed:.0f} s in all.", "",
        f"### {concurrent} chat requests at once, {tokens} greedy tokens each: vLLM against transformers' `generate`",
        "",
        "| base model | scenario | engine | output tok/s | wall (s) | first token p50 (s) | first token p99 (s) "
        "| vLLM / transformers |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for family, r in engines.items():
        for scenario, label in (("base", "base model"), ("mixed", "base + 4 adapters, mixed")):
            v, t = r["vllm"][scenario], r["transformers"][scenario]
            for name, row in (("vLLM", v), ("transformers", t)):
                ratio = f"**{v['tok_s'] / t['tok_s']:.1f}x**" if name == "vLLM" else ""
                lines.append(f"| {family} | {label} | {name} | {row['tok_s']:.0f} | {row['wall_s']:.2f} | "
                             f"{row['ttft_p50']:.3f} | {row['ttft_p99']:.3f} | {ratio} |")
        lines.append(f"| {family} | engine start (s) | vLLM {r['vllm']['start_s']:.1f}, transformers "
                     f"{r['transformers']['start_s']:.1f} | | | | | |")
    lines += ["",
              "Each engine in its own environment (vLLM in the model servers' .venv-serve, transformers in the "
              "service's), the same requests sent at once through the product's engine class "
              "(bench/serving_load.py); adapters are LoRA r=16 on every linear layer, all loaded before timing. "
              "transformers' engine answers one request at a time (the active adapter is the model's state), so "
              "its first-token times grow with the queue; vLLM batches every request, adapters mixed, in each "
              "step. vLLM on a CPU computes in float32 here (the dtype the adapters trained in). Median round "
              "by throughput shown. `tiny-llama` is the bundled 0.9M-parameter model, whose step time is mostly "
              "Python's; `small-llama` is a 25M-parameter Llama built at the bench's start (random weights, the "
              "tiny Llama's tokenizer), where arithmetic sets the step time as it does for a real model."
              " On two CPU cores in float32 a batch of 32 rows of the 25M model is bound by arithmetic (~1.6 GFLOP per step), so batching gains there what the cores' spare FLOPs allow; on a GPU, whose decode step is bound by reading the weights, a batch costs nearly what one row does.", ""]
    if service:
        lines += [
            "### A finished job answers (through the service on a local Ray cluster)", "",
            "| measure | seconds |", "|---|---:|",
            f"| job `succeeded` -> first streamed chat token, model servers at zero replicas | {service['cold_first']:.2f} |",
            f"| ... to the end of that 16-token completion | {service['cold_total']:.2f} |",
            f"| warm replica, adapter loaded: request -> first token (median of 5) | {service['warm_first']:.3f} |",
            f"| warm replica: whole 16-token completion (median of 5) | {service['warm_total']:.3f} |",
            f"| warm replica, base model: request -> first token (median of 5) | {service['base_first']:.3f} |",
            "",
            "The cold figure is a new model server replica (a Ray worker process in the model servers' "
            "environment that imports vLLM and starts its engine process), the base model loaded and warmed "
            "up, the adapter loaded, and the completion: no restart and no deploy step.", "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-service", action="store_true", help="only the engines under load")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    engines = {family: engines_under_load(family, args.tokens, args.concurrent, args.rounds)
               for family in ("tiny-llama", "small-llama")}
    service = {} if args.skip_service else through_the_service()
    section = render(service, engines, args.tokens, args.concurrent, time.perf_counter() - started)
    if not args.no_write:
        replace_section(args.output, SECTION, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
