"""GPU benchmark: tokens/s and model FLOPs utilisation (MFU) of the product's training step on a
0.5B-parameter Llama built from config, LoRA r=16, bf16, packed rows, fused AdamW.

Run from the repository root:

    .venv/bin/python bench/gpu.py                       # writes its section of BENCHMARKS.md
    .venv/bin/python bench/gpu.py --device cpu --small --output /tmp/b.md   # check the code path

On a machine without a CUDA device it writes a section saying so and measures nothing. The step
is the loop's own (`training.steps.token_loss_sum` on `training.packing` rows, the model from
`training.model.load_trainable_model`); MFU = model FLOPs per second / the GPU's dense bf16 peak
(`--peak-tflops`, 989 for an H100 SXM), with model FLOPs per token = 6N for the frozen-base
forward and backward of LoRA counted as 4N (no weight gradients) plus attention.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.report import replace_section  # noqa: E402
from bench.speed import machine  # noqa: E402

SECTION = "## GPU: tokens/s and MFU"


def build(directory: Path, small: bool) -> dict[str, int]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = (dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
            if small else dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=12))
    config = LlamaConfig(vocab_size=32000, num_key_value_heads=dims["num_attention_heads"] // 2,
                         max_position_embeddings=4096, tie_word_embeddings=False, **dims)
    with torch.device("meta"):
        params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return {"params": params, "layers": config.num_hidden_layers, "hidden": config.hidden_size}


def measure(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from eft.training.config import LoraSpec, TrainConfig
    from eft.training.data import Example
    from eft.training.steps import token_loss_sum
    from eft.training.model import load_trainable_model
    from eft.training.packing import collate_packed, packed_micro_batches, real_tokens

    directory = Path(tempfile.mkdtemp(prefix="eft-gpu-"))
    shape = build(directory, args.small)
    gpu = args.device == "cuda"
    cfg = TrainConfig(job_id="bench-gpu", model_path=str(directory), training_file="", validation_file=None,
                      method="lora", lora=LoraSpec(r=16, alpha=32, dropout=0.0), total_steps=args.steps,
                      num_train_examples=0, precision="bf16" if gpu else "fp32",
                      attention=args.attention if gpu else "sdpa")
    model = load_trainable_model(cfg).to(args.device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=gpu or None)
    rng = random.Random(0)
    seq = args.seq_len
    examples = [Example(ids, ids) for ids in ([rng.randrange(1, 32000) for _ in range(
        int(min(seq, max(32, rng.lognormvariate(6.0, 0.8)))))] for _ in range(args.examples))]
    batches = [collate_packed(rows, 0) for rows in packed_micro_batches(examples, seq, args.rows)]
    tokens_per_batch = [real_tokens(rows) for rows in packed_micro_batches(examples, seq, args.rows)]
    batches = [{k: v.to(args.device) for k, v in b.items()} for b in batches]

    def step(i: int) -> int:
        batch = batches[i % len(batches)]
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=gpu):
            loss = token_loss_sum(model, batch) / max(1, int((batch["labels"] != -100).sum()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return tokens_per_batch[i % len(batches)]

    for i in range(2):  # warm-up: kernels chosen, memory pools grown
        step(i)
    if gpu:
        torch.cuda.synchronize()
    started, tokens = time.perf_counter(), 0
    for i in range(args.steps):
        tokens += step(i)
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    n = shape["params"]
    # Attention score and value matmuls: 2 * 2 * layers * hidden * (mean context) per token, x3 fwd+bwd.
    attention = 12 * shape["layers"] * shape["hidden"] * seq / 4
    tps = tokens / seconds
    return {**shape, "tokens_per_s": tps, "seconds": seconds, "tokens": tokens,
            "mfu_lora": tps * (4 * n + attention) / (args.peak_tflops * 1e12),
            "mfu_6n": tps * 6 * n / (args.peak_tflops * 1e12),
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if gpu else float("nan")}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "none")
    parser.add_argument("--small", action="store_true", help="a tiny model, to check the code path")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=4, help="packed rows per step")
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.device == "none":
        section = (f"{SECTION}\n\nNot measured: `bench/gpu.py` found no CUDA device on the machine that ran "
                   f"`make bench` ({machine()}). On a machine with one it measures a 0.5B Llama built from "
                   "config (LoRA r=16, bf16, packed 4096-token rows, fused AdamW).\n")
    else:
        r = measure(args)
        section = "\n".join([
            SECTION, "",
            f"`bench/gpu.py` on {datetime.now():%Y-%m-%d %H:%M} UTC. Machine: {machine()}.", "",
            f"Llama from config: {r['params'] / 1e6:.0f}M parameters ({r['layers']} layers, hidden {r['hidden']}), "
            f"LoRA r=16 on all linear layers, bf16 autocast, {args.attention} attention, {args.rows} packed rows "
            f"of {args.seq_len} tokens per step, fused AdamW; {args.steps} timed steps after 2 warm-up.", "",
            "| tokens/s | MFU (LoRA FLOPs: 4N + attention) | MFU (6N convention) | peak memory GB |",
            "|---:|---:|---:|---:|",
            f"| {r['tokens_per_s']:.0f} | {100 * r['mfu_lora']:.1f}% | {100 * r['mfu_6n']:.1f}% | {r['peak_gb']:.1f} |", "",
        ])
    print(section)
    replace_section(args.output, SECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
