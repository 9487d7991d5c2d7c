"""Memory benchmark: the planner's predicted peak memory against the peak measured in training.

Run from the repository root:

    make bench                              # set up if needed, then run this with the defaults
    .venv/bin/python bench/memory.py        # the same
    .venv/bin/python bench/memory.py --quick --output /tmp/b.md   # 4 short rows, elsewhere

It writes the section "## Memory: planner vs measured" of BENCHMARKS.md (replaced in place on a
rerun; every other section of the file is left alone) and prints the same text.

What it does
------------
1. Builds a Llama model from a config (no download): hidden 512, 8 layers, 8 heads,
   intermediate 1376, vocabulary 8000, about 33.5M parameters, seeded random weights, saved with
   `save_pretrained` (safetensors) in a temporary directory.
2. Asks the planner (`architecture_from_config` on that directory, `PlanSpec`,
   `Configuration("ddp", gradient_checkpointing=..., attention="sdpa")`, `estimate_memory`) for
   every row of the grid: method LoRA r=8 / LoRA r=64 (all-linear, the service's defaults
   otherwise, dropout 0.05 included) / full, gradient checkpointing off / on, sequence length
   256 / 1024, micro batch 4, one worker.
3. Runs every row in a FRESH subprocess (this file with `--worker`), so that the process's peak
   resident set belongs to that row alone. The worker imports torch, transformers, peft and the
   training code and runs one tiny warm-up step (kernel and thread-pool initialisation), then reads
   its resident set (VmRSS in /proc/self/status): the *baseline*. It then loads the model through
   `training.model.load_trainable_model` (the service's own loading path: fp32 weights, PEFT,
   gradient checkpointing) and runs `--steps` (3) training steps the way the DDP strategy does on
   one worker: forward with `training.loop.token_loss_sum` on random token ids (labels = inputs),
   backward, gradient clipping at 1.0, `torch.optim.AdamW` over the trainable parameters,
   `zero_grad(set_to_none=True)`. The *peak* is `resource.getrusage(RUSAGE_SELF).ru_maxrss`.

What "measured" is
------------------
measured = peak resident set - baseline resident set (GB = 10^9 bytes, the planner's unit). It is
everything the model and its training add to the process: weights (fp32), LoRA adapters,
gradients, AdamW states, saved activations, the logits and loss buffers, temporaries alive at the
peak, and whatever glibc malloc keeps of freed memory (fragmentation). It does not include the
interpreter, the libraries or the kernels' workspaces, which are in the baseline.

It is compared with the *comparable* part of the prediction: model states (parameters + gradients
+ optimizer) + activations + the loss share of the planner's overhead term (its 8·s·b·V bytes of
fp32 logits and their gradient). The rest of the overhead term is left out and shown apart: the
CUDA context (0.5 GB, no such thing on CPU) and DDP's gradient buckets (2·φ; one process runs no
DDP). The planner's total (overhead included) is reported as it is.

Precision: the planner assumes 16-bit mixed precision (16-bit weights and gradients, Adam's fp32
master weights, momentum and variance, 16-bit activations). The service trains on CPU in fp32
(`precision="fp32"`, the only precision CPU jobs use), so the 16-bit terms are converted
explicitly, term by term, into an *fp32 equivalent* (`FP32_FACTORS`): parameters x2 (4 bytes
instead of 2), gradients x2, optimizer x2/3 (AdamW on fp32 weights keeps momentum and variance,
8 bytes, and no separate master copy, 12 bytes in the planner), activations x2, loss buffers x1
(the planner already counts them in fp32). Both ratios are printed: fp32-equivalent/measured (the
fair one) and raw 16-bit/measured (what the planner's numbers say as they stand), so the
conversion is never hidden.

A per-term table isolates three terms from the resident set between phases of the same run:
weights = RSS after loading - baseline; AdamW states = RSS growth across the first optimizer step;
forward = largest RSS growth across a forward pass of steps 2.. (the saved activations plus the
logits and the loss; the optimizer states already exist and the gradients were freed).

GPU: where CUDA is available (and `--device cpu` is not given), the worker moves the loaded model
to the GPU and measures with `torch.cuda.reset_peak_memory_stats` / `max_memory_allocated`
(baseline = `memory_allocated` before the move, so 0), the allocator's own numbers; with
`--precision bf16` it runs under autocast like the DDP strategy and converts with `BF16_FACTORS`.
On this repository's CPU machines only the CPU path runs.

Runtime: about 4-6 minutes on 2 CPU cores (each row pays ~5 s of imports; the s=1024 rows
dominate). `--quick` runs 4 rows of 2 steps at s=256 only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECTION = "## Memory: planner vs measured"
GB = 1e9

#: The benchmark model, a scaled-down Llama whose terms stand well above the resident-set noise.
MODEL_CONFIG = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=8, intermediate_size=1376, vocab_size=8000,
                    tie_word_embeddings=False, attention_dropout=0.0)
MICRO_BATCH = 4
SEQ_LENS = (256, 1024)
METHODS = (("lora", 8), ("lora", 64), ("full", None))

#: Planner bytes (16-bit mixed precision) -> bytes of the run, term by term.
FP32_FACTORS = {"parameters": 2.0, "gradients": 2.0, "optimizer": 8 / 12, "activations": 2.0,
                "loss": 1.0}
#: bf16 autocast over fp32 weights (the DDP strategy on a GPU): weights, gradients and AdamW
#: states stay fp32, activations are mostly 16-bit. Autocast's 16-bit weight copies are not modelled.
BF16_FACTORS = {"parameters": 2.0, "gradients": 2.0, "optimizer": 8 / 12, "activations": 1.0,
                "loss": 1.0}
FACTORS = {"fp32": FP32_FACTORS, "bf16": BF16_FACTORS}


@dataclass(frozen=True)
class Row:
    method: str
    r: int | None
    checkpointing: bool
    seq_len: int

    def label(self) -> str:
        return "full" if self.method == "full" else f"LoRA r={self.r}"


def grid(quick: bool) -> list[Row]:
    seq_lens = SEQ_LENS[:1] if quick else SEQ_LENS
    methods = METHODS[::2] if quick else METHODS
    return [Row(m, r, gc, s) for s in seq_lens for m, r in methods for gc in (False, True)]


# --- the worker: one row, in its own process -----------------------------------------------------


def _vmrss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker(spec: dict) -> dict:
    """Load the model of `spec` through the service's path, train `steps` steps, return memory."""
    import gc

    import peft  # noqa: F401 - imported before the baseline: code is not what we measure
    import torch
    import transformers  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    from training.config import LoraSpec, TrainConfig
    from training.loop import token_loss_sum
    from training.model import load_trainable_model

    torch.set_num_threads(spec["threads"])
    use_cuda = spec["device"] == "cuda"
    device = torch.device("cuda" if use_cuda else "cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[spec["precision"]]

    def autocast():  # as the DDP strategy does
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    # Warm-up: initialise the kernels, thread pools and allocator paths on a toy model, so their
    # one-off memory sits in the baseline and not in the first row's model share.
    toy = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)).to(device)
    toy_opt = torch.optim.AdamW(toy.parameters())
    x = torch.randint(0, 64, (2, 16), device=device)
    q = torch.randn(2, 2, 16, 16, device=device, requires_grad=True)
    with autocast():
        out = toy(x)
        att = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        loss = torch.nn.functional.cross_entropy(out.flatten(0, 1).float(), x.flatten()) + att.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(toy.parameters(), 1.0)
    toy_opt.step()
    del toy, toy_opt, x, q, out, att, loss
    gc.collect()

    def current() -> int:
        return torch.cuda.memory_allocated(device) if use_cuda else _vmrss_bytes()

    if use_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    baseline = current()
    peak_before = 0 if use_cuda else _maxrss_bytes()

    lora = LoraSpec(r=spec["r"]) if spec["method"] == "lora" else None
    cfg = TrainConfig(
        job_id="bench-memory", model_path=spec["model_path"], training_file="", validation_file=None,
        method=spec["method"], lora=lora, total_steps=spec["steps"], num_train_examples=0,
        micro_batch_size=spec["micro_batch"], max_seq_len=spec["seq_len"],
        gradient_checkpointing=spec["checkpointing"], precision=spec["precision"], attention="sdpa",
    )
    started = time.perf_counter()
    model = load_trainable_model(cfg)
    if use_cuda:
        model = model.to(device)
        torch.cuda.synchronize()
    gc.collect()
    after_load = current()
    load_peak = torch.cuda.max_memory_allocated(device) if use_cuda else _maxrss_bytes()
    load_s = time.perf_counter() - started

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    model.train()
    vocab = model.config.vocab_size
    b, s = spec["micro_batch"], spec["seq_len"]
    generator = torch.Generator().manual_seed(cfg.seed)
    phases = []
    started = time.perf_counter()
    for _ in range(spec["steps"]):
        ids = torch.randint(0, vocab, (b, s), generator=generator).to(device)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        p = {"start": current()}
        with autocast():
            loss = token_loss_sum(model, batch) / (b * (s - 1))
        p["forward"] = current()
        loss.backward()
        p["backward"] = current()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm or 1.0)
        optimizer.step()
        p["optimizer"] = current()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch, ids
        p["end"] = current()
        phases.append(p)
    if use_cuda:
        torch.cuda.synchronize()
    train_s = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) if use_cuda else _maxrss_bytes()
    return {
        "baseline": baseline, "peak_before_load": peak_before, "after_load": after_load,
        "load_peak": load_peak, "peak": peak, "phases": phases,
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "load_s": load_s, "train_s": train_s, "memory": "cuda allocator" if use_cuda else "RSS",
    }


# --- the driver ----------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    import peft
    import torch
    import transformers

    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    info = {
        "CPU": cpu,
        "cores": f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable",
        "RAM": f"{mem_kib * 1024 / 2**30:.1f} GiB",
        "GPU": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "Python": platform.python_version(),
        "OS": f"{platform.system()} {platform.release()}",
    }
    return info


def build_model(directory: Path, max_seq_len: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=max_seq_len, **MODEL_CONFIG)
    LlamaForCausalLM(config).save_pretrained(directory)


def predict(model_dir: Path, row: Row) -> dict[str, float]:
    """The planner's terms for `row` in GB, plus the loss share of its overhead."""
    from service.planner import Configuration, PlanSpec, architecture_from_config, estimate_memory

    arch = architecture_from_config(model_dir, name="bench-llama")
    extra = {"lora_r": row.r, "lora_targets": "all-linear"} if row.method == "lora" else {}
    spec = PlanSpec(arch, method=row.method, seq_len=row.seq_len, micro_batch=MICRO_BATCH, gpus=1,
                    **extra)
    config = Configuration("ddp", gradient_checkpointing=row.checkpointing, attention="sdpa")
    est = estimate_memory(spec, config)
    loss = spec.overheads.logits_bytes * row.seq_len * MICRO_BATCH * arch.vocab_size / GB
    return {"parameters": est.parameters, "gradients": est.gradients, "optimizer": est.optimizer,
            "activations": est.activations, "overhead": est.overhead, "total": est.total,
            "loss": loss, "theta": arch.parameters, "phi": spec.trainable_parameters}


def comparable(pred: dict[str, float], factors: dict[str, float]) -> float:
    return sum(pred[t] * factors[t] for t in ("parameters", "gradients", "optimizer",
                                               "activations", "loss"))


def run_row(row: Row, model_dir: Path, args: argparse.Namespace, device: str) -> dict:
    spec = {"model_path": str(model_dir), "method": row.method, "r": row.r,
            "checkpointing": row.checkpointing, "seq_len": row.seq_len, "micro_batch": MICRO_BATCH,
            "steps": args.steps, "threads": args.threads, "device": device,
            "precision": args.precision}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"worker for {row} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def g(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def render(info: dict[str, str], rows: list[tuple[Row, dict, dict]], args: argparse.Namespace,
           device: str, elapsed: float, theta: int) -> str:
    f = FACTORS[args.precision]
    where = "GPU, CUDA allocator" if device == "cuda" else "CPU, resident set"
    lines = [
        SECTION, "",
        f"Written by `bench/memory.py` (`make bench`) on {time.strftime('%Y-%m-%d %H:%M %Z')}; "
        f"whole run {elapsed:.0f} s. How it measures, and what, is in the script's docstring.", "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".", "",
        f"Model: Llama from config, hidden {MODEL_CONFIG['hidden_size']}, "
        f"{MODEL_CONFIG['num_hidden_layers']} layers, {MODEL_CONFIG['num_attention_heads']} heads, "
        f"intermediate {MODEL_CONFIG['intermediate_size']}, vocabulary {MODEL_CONFIG['vocab_size']}: "
        f"θ = {theta / 1e6:.2f}M parameters, saved with `save_pretrained` and loaded with "
        f"`load_trainable_model` ({args.precision} weights, sdpa attention). Micro batch "
        f"{MICRO_BATCH}, {args.steps} training steps (AdamW, clipping at 1.0), one worker, "
        f"{where}, {args.threads} threads. LoRA: all-linear, alpha 16, dropout 0.05 (the "
        "service's defaults).", "",
        "Units: GB = 10^9 bytes. Planner terms are as `estimate_memory` returns them (16-bit mixed "
        "precision, `ddp`, one GPU). *Comparable* = parameters + gradients + optimizer + "
        "activations + loss buffers (8·s·b·V, the share of the overhead term that exists here); "
        "the rest of the overhead (0.5 GB CUDA context, 2φ DDP buckets) has no counterpart in "
        "one CPU process and is left out of it. *fp32 eq.* converts the comparable terms to "
        f"this run's {args.precision} training: parameters ×{f['parameters']:g}, gradients "
        f"×{f['gradients']:g}, optimizer ×{f['optimizer']:.3g} (AdamW's 8 bytes against the "
        f"planner's 12), activations ×{f['activations']:g}, loss ×{f['loss']:g}. *Measured* = "
        "peak − baseline (" + ("max_memory_allocated − memory_allocated before the model"
                              if device == "cuda" else
                              "ru_maxrss − VmRSS after imports and warm-up, before the model") +
        "), in a fresh process per row.", "",
        "| method | GC | s | φ trainable | params | grads | optim | activ | overhead | planner "
        "total | comparable 16-bit | fp32 eq. | measured | fp32 eq. / measured | 16-bit / "
        "measured |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, pred, m in rows:
        measured = (m["peak"] - m["baseline"]) / GB
        c16, c32 = comparable(pred, {k: 1.0 for k in f}), comparable(pred, f)
        lines.append(
            f"| {row.label()} | {'on' if row.checkpointing else 'off'} | {row.seq_len} | "
            f"{m['trainable_parameters'] / 1e6:.2f}M | {g(pred['parameters'])} | "
            f"{g(pred['gradients'])} | {g(pred['optimizer'])} | {g(pred['activations'])} | "
            f"{g(pred['overhead'])} | {g(pred['total'])} | {g(c16)} | {g(c32)} | {g(measured)} | "
            f"{c32 / measured:.2f} | {c16 / measured:.2f} |")
    lines += [
        "",
        "### Per term",
        "",
        "The same runs, split by phase (differences of the "
        + ("allocated bytes" if device == "cuda" else "resident set") + " between points of one "
        "run; fp32-equivalent predictions). *Weights*: after loading − baseline, against "
        "parameters ×2 (fp32 θ plus LoRA's φ). *AdamW*: growth across the first optimizer step, "
        "against optimizer ×2/3 (8φ). *Forward*: the largest growth across a forward pass after "
        "the first step (saved activations, logits, loss), against activations ×2 + loss "
        "buffers. *Load peak*: the peak while loading, before training.",
        "",
        "| method | GC | s | weights pred. | weights meas. | AdamW pred. | AdamW meas. | forward "
        "pred. | forward meas. | forward pred./meas. | load peak − baseline | peak − after load | "
        "load s | train s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, pred, m in rows:
        ph = m["phases"]
        weights = (m["after_load"] - m["baseline"]) / GB
        adam = (ph[0]["optimizer"] - ph[0]["backward"]) / GB
        later = ph[1:] or ph
        forward = max(p["forward"] - p["start"] for p in later) / GB
        fwd_pred = pred["activations"] * f["activations"] + pred["loss"] * f["loss"]
        lines.append(
            f"| {row.label()} | {'on' if row.checkpointing else 'off'} | {row.seq_len} | "
            f"{g(pred['parameters'] * f['parameters'])} | {g(weights)} | "
            f"{g(pred['optimizer'] * f['optimizer'])} | {g(adam)} | {g(fwd_pred)} | {g(forward)} | "
            f"{fwd_pred / forward:.2f} | {g((m['load_peak'] - m['baseline']) / GB)} | "
            f"{g((m['peak'] - m['after_load']) / GB)} | {m['load_s']:.1f} | {m['train_s']:.1f} |")
    lines += ["", "### Reading the ratios", "", READING.strip(), ""]
    return "\n".join(lines)


READING = """
A ratio above 1 means the planner over-predicts this run (safe: it refuses or adds optimizations a
job would not need), below 1 that it under-predicts (a job it admits could run out of memory). The
fp32-equivalent ratio is the test of the planner's formulas; the 16-bit ratio is what its numbers
say about a CPU job as they stand. The planner's full-fine-tuning model states are 16θ bytes either
way (2+2+12 in mixed precision, 4+4+8 in fp32), so for full fine-tuning the two columns differ only
by the activation and LoRA-weight terms. The per-term table says which term a miss comes from:
weights and AdamW states are close to exact; the forward (activations) term is where the formula
(Korthikanti et al.'s GPT layer with 4h MLP and dropout, 16-bit) and this model (SwiGLU MLP with
intermediate 2.69h, LoRA dropout on every adapted input, sdpa's fused CPU kernel without the
quadratic scores, fp32 logits copied by the loss) part ways. Measured resident set also keeps what
malloc does not return after frees, so a measured figure is an upper bound on live tensors.
"""


def replace_section(path: Path, section: str) -> None:
    """Put `section` (starting with the SECTION heading) into `path`, replacing the old one in
    place (up to the next level-2 heading) and leaving every other section alone."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    new = section.rstrip("\n").splitlines()
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += [""] + new
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = lines[end:]
        lines = lines[:start] + new + ([""] + tail if tail else [])
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=3, help="training steps per row (default 3)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch threads per row (default: the usable cores)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--precision", choices=tuple(FACTORS), default="fp32",
                        help="bf16 only on a GPU (autocast, as the DDP strategy)")
    parser.add_argument("--quick", action="store_true", help="4 rows at s=256, 2 steps")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    import torch

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    if args.precision == "bf16" and device == "cpu":
        parser.error("--precision bf16 is for the GPU path; CPU jobs train in fp32")
    if args.quick:
        args.steps = min(args.steps, 2)
    rows = grid(args.quick)
    started = time.perf_counter()
    info = machine()
    results = []
    with tempfile.TemporaryDirectory(prefix="eft-bench-memory-") as tmp:
        model_dir = Path(tmp) / "bench-llama"
        build_model(model_dir, max(r.seq_len for r in rows))
        for i, row in enumerate(rows, 1):
            pred = predict(model_dir, row)
            t0 = time.perf_counter()
            m = run_row(row, model_dir, args, device)
            measured = (m["peak"] - m["baseline"]) / GB
            print(f"[{i}/{len(rows)}] {row.label():10} GC {'on ' if row.checkpointing else 'off'} "
                  f"s={row.seq_len:<5} measured {measured:.3f} GB, fp32 eq. "
                  f"{comparable(pred, FACTORS[args.precision]):.3f} GB "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            if m["trainable_parameters"] != pred["phi"]:
                print(f"  note: {m['trainable_parameters']} trainable parameters, planner φ = "
                      f"{pred['phi']}", file=sys.stderr)
            if m["total_parameters"] - (m["trainable_parameters"] if row.method == "lora" else 0) != pred["theta"]:
                print(f"  note: {m['total_parameters']} parameters, planner θ = {pred['theta']}",
                      file=sys.stderr)
            results.append((row, pred, m))
        theta = int(results[0][1]["theta"])
    section = render(info, results, args, device, time.perf_counter() - started, theta)
    replace_section(args.output, section)
    print(section)
    print(f"\nwrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
