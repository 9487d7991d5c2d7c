"""GPU benchmark: the product's own training path per strategy and method, on a 0.5B Llama built
from config: tokens/s, MFU, and peak memory against the planner.

Run from the repository root on a machine with a CUDA device (`make gpu-check` runs it after the
GPU tests):

    .venv/bin/python bench/gpu.py                       # writes its section of BENCHMARKS.md
    .venv/bin/python bench/gpu.py --device cpu --small --output /tmp/b.md   # check the code path

Each row is one run of `training.loop.train_loop_per_worker` (the function every job's Ray Train
worker runs: data, model, strategy, packed micro-batches, optimizer, reports) in a one-GPU
TorchTrainer on a local Ray cluster, with the config a job would get (bf16, flash-attention 2
where the flash-attn package is installed, else SDPA per example; packing on; LoRA r=16 on all
linear layers, or QLoRA nf4). Its metrics are what the loop reports: tokens/s over the steps
after the first (warm-up) report, and the allocator's peak, set against the planner's total for
the same job (`eft.planner.estimate_memory`, as the service plans it).

MFU = model FLOPs per second / the GPU's dense bf16 peak (`--peak-tflops`, 989 for an H100 SXM),
counted as the scaling-law anchors count them (Kaplan et al.; PaLM, appendix B): 6N per token
for the weights (N without the embeddings), whatever the method, plus attention, 12 * layers *
hidden * n per token of an example of n tokens (each example attends to itself only, so the
attention term follows the examples' own lengths, not the packed row's).

On a machine without a CUDA device it writes a section saying so and measures nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.report import replace_section  # noqa: E402
from bench.speed import machine  # noqa: E402

SECTION = "## GPU: tokens/s and MFU"
TOKENIZER = ROOT / "assets" / "models" / "tiny-llama"
#: (strategy, method) rows.
#: `bare` is the ceiling: the same model and LoRA in a plain PyTorch loop on full rows.
ROWS = (("bare", "lora"), ("ddp", "lora"), ("fsdp", "lora"), ("zero3", "lora"), ("ddp", "qlora"))


def build(directory: Path, small: bool) -> dict[str, int]:
    """A Llama from config with random bf16 weights and the bundled tokenizer, saved as any
    Hugging Face model directory."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = (dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
            if small else dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=12))
    config = LlamaConfig(vocab_size=32000, num_key_value_heads=dims["num_attention_heads"] // 2,
                         max_position_embeddings=8192, tie_word_embeddings=False, **dims)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, directory / name)
    embeddings = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or "lm_head" in n)
    return {"params": sum(p.numel() for p in model.parameters()), "non_embedding": model.num_parameters() - embeddings,
            "layers": config.num_hidden_layers, "hidden": config.hidden_size}


def build_data(path: Path, examples: int, seq_len: int) -> None:
    """Text records of log-normally spread lengths (median ~400 words, up to the sequence)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(2000)]
    with path.open("w") as f:
        for _ in range(examples):
            n = int(min(seq_len * 0.9, max(32, rng.lognormvariate(6.0, 0.8))))
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n))}) + "\n")


def _loop(config: dict[str, Any]) -> None:
    """The product's worker function, its reports kept in a file (no job store here). With
    `profile`, steps 3-5 run under torch.profiler and its tables land beside the reports."""
    import contextlib

    import torch

    from bench.baselines.plain_loop import run_recipe

    rows: list[dict[str, Any]] = []
    profiler: Any = contextlib.nullcontext()
    if config.get("profile"):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities,
                                          schedule=torch.profiler.schedule(wait=2, warmup=1, active=3))

    def publish(recipe: Any, metrics: dict[str, float]) -> None:
        rows.append(dict(metrics))

    with profiler:
        recipe = run_recipe(config["train"], publish,
                            after_step=profiler.step if config.get("profile") else None)
    if recipe.rank == 0:
        if torch.cuda.is_available():  # what the caching allocator held at most: what runs out first
            rows.append({"reserved_gb": torch.cuda.max_memory_reserved() / 1e9})
        Path(config["out"]).write_text(json.dumps(rows))
        if config.get("profile"):
            Path(config["out"]).with_name("profile.txt").write_text(profile_tables(profiler))


def profile_tables(profiler: Any) -> str:
    """The profiled steps' busiest operators by device time and by host time, and how much of
    the wall time the device was busy."""
    averages = profiler.key_averages()
    import torch

    device = sum(e.time_range.elapsed_us() for e in profiler.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA)  # the kernels themselves
    wall = max((e.time_range.end for e in profiler.events()), default=0) - min(
        (e.time_range.start for e in profiler.events()), default=0)
    return "\n\n".join([
        f"device busy {device / 1e3:.0f} ms of {wall / 1e3:.0f} ms wall over 3 steps",
        averages.table(sort_by="self_device_time_total", row_limit=25),
        averages.table(sort_by="self_cpu_time_total", row_limit=25),
    ])


def _bare_loop(config: dict[str, Any]) -> None:
    """The ceiling: the same model with PEFT LoRA in a plain PyTorch loop, micro-batches of full
    rows of random tokens (one causal sequence per row, SDPA), AdamW; tokens/s over the steps
    after the first."""
    import time

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    train = config["train"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(train["model_path"], dtype=dtype, attn_implementation="sdpa").to(device)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    rows, seq = train["micro_batch_size"], train["max_seq_len"]
    per_step = max(1, config["tokens_per_step"] // (rows * seq))
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(train["total_steps"]):
        started = time.perf_counter()
        for _ in range(per_step):
            ids = torch.randint(3, 32000, (rows, seq), generator=generator).to(device)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    tokens = per_step * rows * seq
    peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0
    Path(config["out"]).write_text(json.dumps([{"step": i + 1, "tokens_per_s": tokens / t} for i, t in enumerate(times)]
                                              + [{"final": True, "peak_memory_gb": peak},
                                                 {"reserved_gb": torch.cuda.max_memory_reserved() / 1e9
                                                  if device.type == "cuda" else float("nan")}]))


def attention_probe(examples: int = 30) -> list[str]:
    """What attention costs a packed micro-batch of `examples` fresh lengths (100-4096 tokens, new
    for each way, as each training step's are): forward and backward of causal attention with the
    bench model's heads (12 query, 6 key/value, dim 128, bf16), per example through SDPA's
    default backend choice, per example with flash only, and as one `varlen_attn` call over the
    packed row (`training/attention.py`'s device path). Returns the section's lines."""
    import contextlib
    import time

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from eft.training.attention import _device_varlen, _varlen_kernel

    device, dtype, heads, groups, dim = torch.device("cuda"), torch.bfloat16, 12, 2, 128

    def tensors(n: int) -> tuple[torch.Tensor, ...]:
        q = torch.randn(1, heads, n, dim, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(1, heads // groups, n, dim, device=device, dtype=dtype, requires_grad=True) for _ in "kv")
        return q, k, v

    q, k, v = tensors(1000)
    choice = SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True)).name

    def per_example(lengths: list[int]) -> None:
        for n in lengths:
            q, k, v = tensors(n)
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()

    def varlen(lengths: list[int]) -> None:
        q, k, v = tensors(sum(lengths))
        bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        _device_varlen(q, k, v, bounds, max(lengths), dim ** -0.5, None).sum().backward()

    def timed(run, seed: int, backends=None) -> float:
        rng = random.Random(seed)
        lengths = [rng.randint(100, 4096) for _ in range(examples)]
        context = sdpa_kernel(backends) if backends else contextlib.nullcontext()
        torch.cuda.synchronize()
        started = time.perf_counter()
        with context:
            run(lengths)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) * 1e3

    timed(per_example, 0, [SDPBackend.FLASH_ATTENTION])  # the kernels' own warm-up
    default = timed(per_example, 1)
    flash = timed(per_example, 2, [SDPBackend.FLASH_ATTENTION])
    one_call = timed(varlen, 3) if _varlen_kernel() is not None else float("nan")
    one_call = min(one_call, timed(varlen, 4)) if _varlen_kernel() is not None else one_call
    return [
        f"Attention of one packed micro-batch of {examples} fresh example lengths (100-4096 tokens), forward and "
        f"backward, 12 query / 6 key-value heads of 128, bf16: SDPA's own choice for a [1, 12, 1000, 128] causal "
        f"segment is **{choice}** (torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}).", "",
        "| attention | ms |", "|---|---:|",
        f"| per example, SDPA's default backend | {default:.1f} |",
        f"| per example, flash only | {flash:.1f} |",
        f"| one `varlen_attn` call (the product's device path) | {one_call:.1f} |", "",
    ]


def planned_gb(model_dir: Path, cfg: Any) -> float:
    from eft.planner import PlanSpec, architecture_from_config, estimate_memory
    from eft.planner.spec import Configuration

    spec = PlanSpec(architecture_from_config(model_dir), method=cfg.method, seq_len=cfg.max_seq_len,
                    micro_batch=cfg.micro_batch_size, gpus=1, precision=cfg.precision,
                    device="cuda" if cfg.use_gpu else "cpu", lora_r=cfg.lora.r, lora_dropout=cfg.lora.dropout,
                    gradient_accumulation=False)
    return estimate_memory(spec, Configuration(cfg.strategy, attention=cfg.attention)).allocated  # against the allocated peak


def run_row(model_dir: Path, data: Path, strategy: str, method: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray.train.torch
    from ray.train import RunConfig, ScalingConfig

    from eft.training.config import LoraSpec, TrainConfig

    gpu = args.device == "cuda"
    flash = gpu and importlib.util.find_spec("flash_attn") is not None
    cfg = TrainConfig(
        job_id=f"bench-gpu-{strategy}-{method}", model_path=str(model_dir), training_file=str(data),
        validation_file=None, method=method,
        lora=LoraSpec(r=16, alpha=32, dropout=0.0, quant_type="nf4" if method == "qlora" else None),
        total_steps=args.steps, num_train_examples=args.examples, learning_rate=1e-4,
        global_batch_size=args.global_batch, micro_batch_size=args.rows, max_seq_len=args.seq_len,
        train_on="all", log_every_steps=1, use_gpu=gpu, cpus_per_worker=1 if gpu else 2,
        strategy="ddp" if strategy == "bare" else strategy,
        checkpoint_every_steps=10**9, precision="bf16" if gpu else "fp32",
        attention="flash_attention_2" if flash else "sdpa", packing=True,
        data_cache_dir=tempfile.mkdtemp(prefix="eft-gpu-cache-"),
    )
    out = Path(tempfile.mkdtemp(prefix="eft-gpu-rows-")) / "rows.json"
    storage = tempfile.mkdtemp(prefix="eft-gpu-ckpt-")
    bare = strategy == "bare"
    trainer = ray.train.torch.TorchTrainer(
        _bare_loop if bare else _loop,
        train_loop_config={"train": cfg.to_dict(), "out": str(out), "profile": args.profile and not bare,
                           "tokens_per_step": args.tokens_per_step},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=gpu, resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=RunConfig(name=cfg.job_id, storage_path=storage),
    )
    trainer.fit()
    if args.profile and out.with_name("profile.txt").exists():
        shutil.copy(out.with_name("profile.txt"), args.output.with_name(f"profile-{strategy}-{method}.txt"))
    rows = json.loads(out.read_text())
    steady = [r for r in rows if "tokens_per_s" in r and r["step"] > 1]
    final = next(r for r in rows if r.get("final"))
    return {"strategy": strategy, "method": method, "attention": cfg.attention,
            "tokens_per_s": sum(r["tokens_per_s"] for r in steady) / len(steady),
            "peak_gb": final["peak_memory_gb"],
            "reserved_gb": next((r["reserved_gb"] for r in rows if "reserved_gb" in r), float("nan")),
            "planned_gb": planned_gb(model_dir, cfg) if not bare else float("nan")}


def versions() -> str:
    """The versions of the libraries the rows run on, and the GPU driver's."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found = []
    for name in ("ray", "transformers", "peft", "deepspeed", "bitsandbytes", "flash-attn"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"no {name}")
    driver = ""
    if torch.cuda.is_available():
        import subprocess

        query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, check=False)
        driver = f", driver {query.stdout.strip()}" if query.returncode == 0 else ""
    return ", ".join(found) + driver


def mean_attention_context(data: Path, model_dir: Path, seq_len: int) -> float:
    """Token-weighted mean example length (the attention term per token is 12·L·h times it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [min(seq_len, len(tokenizer(json.loads(line)["text"])["input_ids"]) + 1)
               for line in data.read_text().splitlines()]
    return sum(n * n for n in lengths) / sum(lengths)


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "none")
    parser.add_argument("--small", action="store_true", help="a tiny model, to check the code path")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=4, help="micro_batch_size: a micro-batch packs rows x seq-len tokens")
    parser.add_argument("--global-batch", type=int, default=32, help="examples per optimizer step")
    parser.add_argument("--examples", type=int, default=800)
    parser.add_argument("--rows-to-run", default=",".join(f"{s}:{m}" for s, m in ROWS))
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--profile", action="store_true",
                        help="profile steps 3-5 of each product row: profile-<strategy>-<method>.txt beside --output")
    parser.add_argument("--tokens-per-step", type=int, default=65536,
                        help="the `bare` row's tokens per optimizer step (rows of --seq-len random tokens)")
    args = parser.parse_args(argv)
    if args.device == "none":
        section = (f"{SECTION}\n\nNot measured: `bench/gpu.py` found no CUDA device on the machine that ran "
                   f"`make bench` ({machine()}). On a machine with one (`make gpu-check`) it runs the product's "
                   "training loop in a one-GPU Ray Train worker on a 0.5B Llama built from config, for DDP, FSDP2 "
                   "and ZeRO-3 with LoRA and DDP with QLoRA, and reports tokens/s, MFU (6N + attention) and peak "
                   "memory against the planner.\n")
        print(section)
        text = args.output.read_text() if args.output.exists() else ""
        if SECTION in text and "| strategy | method |" in text.split(SECTION, 1)[1].split("\n## ", 1)[0]:
            print(f"{args.output} keeps its GPU rows measured earlier on a machine with CUDA.")
            return 0
        replace_section(args.output, SECTION, section)
        return 0

    import ray

    try:
        probe = attention_probe() if args.device == "cuda" else []
    except Exception as error:  # the rows below still measure the product
        import traceback

        traceback.print_exc()
        probe = [f"The attention probe failed: `{type(error).__name__}: {error}`.", ""]
    print("\n".join(probe), flush=True)
    home = Path(tempfile.mkdtemp(prefix="eft-gpu-"))
    model_dir, data = home / "model", home / "train.jsonl"
    shape = build(model_dir, args.small)
    build_data(data, args.examples, args.seq_len)
    context = mean_attention_context(data, model_dir, args.seq_len)
    flops_per_token = 6 * shape["non_embedding"] + 12 * shape["layers"] * shape["hidden"] * context
    # The workers import bench/ (the loop's wrapper) from the repository.
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=4, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": python_path}})
    results = []
    try:
        for row in args.rows_to_run.split(","):
            strategy, method = row.split(":")
            if method == "qlora" and args.device != "cuda":
                continue  # bitsandbytes' 4-bit kernels need CUDA
            result = run_row(model_dir, data, strategy, method, args)
            # The bare rows are whole causal rows: their attention spans the row, not an example.
            per_token = flops_per_token if strategy != "bare" else (
                6 * shape["non_embedding"] + 12 * shape["layers"] * shape["hidden"] * args.seq_len)
            result["mfu"] = result["tokens_per_s"] * per_token / (args.peak_tflops * 1e12)
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        ray.shutdown()
    section = "\n".join([
        SECTION, "",
        f"`bench/gpu.py` on {datetime.now():%Y-%m-%d %H:%M} UTC. Machine: {machine()}; {versions()}.", "",
        f"Llama from config: {shape['params'] / 1e6:.0f}M parameters ({shape['non_embedding'] / 1e6:.0f}M without "
        f"embeddings; {shape['layers']} layers, hidden {shape['hidden']}), text examples of log-normal length "
        f"(token-weighted mean context {context:.0f}), packed into micro-batches of {args.rows} x {args.seq_len} "
        f"tokens, {args.global_batch} examples per step, {args.steps} steps; the product's training loop in a "
        f"one-GPU Ray Train worker; MFU against {args.peak_tflops:g} TFLOP/s (6N + attention). The `bare` row is "
        f"the ceiling to compare with: the same model and LoRA in a plain PyTorch loop (PEFT, SDPA, AdamW) on whole "
        f"rows of random tokens, {args.tokens_per_step} tokens per step, in the same kind of worker.", "",
        *probe,
        "| strategy | method | attention | tokens/s | MFU | peak GB | reserved GB | planner GB | planner / peak |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['strategy']} | {r['method']} | {r['attention']} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | "
          f"{r['peak_gb']:.2f} | {r['reserved_gb']:.2f} | " + ("- | - |" if r["strategy"] == "bare" else
                                       f"{r['planned_gb']:.2f} | {r['planned_gb'] / r['peak_gb']:.2f} |") for r in results),
        "",
    ])
    print(section)
    replace_section(args.output, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
