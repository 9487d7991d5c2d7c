"""Memory benchmark: the planner's predicted peak memory against the peak measured in training.

Run from the repository root:

    make bench                              # set up if needed, then run this with the defaults
    .venv/bin/python bench/memory.py        # the same
    .venv/bin/python bench/memory.py --quick --output /tmp/b.md   # 4 short rows, elsewhere

It writes the section "## Memory: planner vs measured" of BENCHMARKS.md (replaced in place on a
rerun; every other section of the file is left alone), prints the same text, and reports the
machine: CPU model (/proc/cpuinfo), cores, RAM, GPU, torch / transformers / peft versions.

What it does
------------
1. Builds a Llama model from a config (no download): hidden 512, 8 layers, 8 heads,
   intermediate 1376, vocabulary 8000, 33.5M parameters, seeded random weights, saved with
   `save_pretrained` (safetensors) in a temporary directory.
2. Asks the planner (`architecture_from_config` on that directory, `PlanSpec`,
   `Configuration("ddp", gradient_checkpointing=..., attention="sdpa")`, `estimate_memory`), in
   the same run, for every row of the grid: LoRA r=8 / LoRA r=64 (all-linear; alpha 16 and
   dropout 0.05, the service's defaults) / full fine-tuning, x gradient checkpointing off / on,
   x sequence length 256 / 1024, micro batch 4, one worker; LoRA r=64 at s=256 only, to stay
   under 6 minutes on 2 idle cores (GRID_NOTE): 10 rows.
3. Runs every row in a FRESH subprocess (this file with `--worker`), so that the process's peak
   resident set belongs to that row alone. The worker imports torch, transformers, peft and the
   training code and runs a tiny warm-up step (kernels, thread pools, the profiler), then reads
   its resident set (VmRSS in /proc/self/status): the *baseline*. It loads the model through
   `training.model.load_trainable_model` (the service's own path: fp32 weights, PEFT, gradient
   checkpointing) and runs `--steps` (3) training steps the way the DDP strategy runs one worker:
   forward with `training.steps.token_loss_sum` on random token ids (labels = inputs), backward,
   gradient clipping at 1.0, `torch.optim.AdamW` over the trainable parameters,
   `zero_grad(set_to_none=True)`. Then it reads the *peak*:
   `resource.getrusage(RUSAGE_SELF).ru_maxrss`.
4. Runs one more step under `torch.profiler` with `profile_memory=True`, which records every
   allocation and free of the CPU allocator: the live-bytes curve across forward, backward and
   the optimizer, for the per-term table. It runs after the peak was read because its event
   buffers inflate the resident set by a few hundred MB.

What "measured" is
------------------
measured = peak resident set - baseline resident set (GB = 10^9 bytes, the planner's unit): what
the model and its training add to the process: weights (fp32; transformers maps the safetensors
file, so they become resident during the first forward, not at loading), LoRA adapters,
gradients, AdamW states, saved activations, logits and loss buffers, temporaries alive at the
peak, and what glibc malloc keeps of freed memory. The interpreter, the libraries and the
kernels' one-off workspaces are in the baseline. *Tensors* is the same without malloc: weights +
AdamW states + the highest point of the profiled step's live bytes above its start. *Process
peak* is ru_maxrss itself, which is what `training.steps.peak_memory_gb` reports on CPU.

Both are compared with the *comparable* part of the prediction: model states (parameters +
gradients + optimizer) + activations + the loss share of the planner's overhead term (8·s·b·V
bytes of fp32 logits and their gradient). The rest of the overhead term, the CUDA context (0.5 GB;
nothing of the kind on CPU) and DDP's gradient buckets (2φ; one process runs no DDP), is left out
of the comparison; the planner's total, overhead included, is shown as it is.

Precision: the planner has no precision setting; it assumes 16-bit mixed precision (16-bit
weights and gradients, Adam's fp32 master weights, momentum and variance, 16-bit activations).
The service trains CPU jobs in fp32 (`precision="fp32"`), so the 16-bit terms are converted
explicitly, term by term, into an *fp32 equivalent* (`FP32_FACTORS`): parameters x2 (4 bytes
instead of 2), gradients x2, optimizer x2/3 (AdamW on fp32 weights keeps momentum and variance,
8 bytes, and no separate master copy; the planner counts 12), activations x2, loss buffers x1 (the
planner counts them in fp32 already). Both ratios are printed: fp32 eq. / measured (the test of
the formulas) and comparable (16-bit, unconverted) / measured (what the planner's numbers say
about a CPU job as they stand), so the conversion is never hidden.

GPU: where CUDA is available (and `--device cpu` is not given), the worker moves the loaded model
to the GPU and reads the CUDA allocator instead: baseline `memory_allocated` before the move,
`reset_peak_memory_stats`, peak `max_memory_allocated`; the per-term step reads
`memory_allocated` at the phase boundaries. `--precision bf16` runs under autocast as the DDP
strategy does and converts with `BF16_FACTORS`. Written, but not run on the CPU machines here.

Runtime: about 5 minutes on 2 idle cores (10 rows; each pays ~10 s of imports, warm-up and
loading, then 4 steps: ~15 s a row at s=256, 30-45 s at s=1024), two to three times that when
other jobs share the cores (the section records wall time, CPU time and load average).
`--quick`: 4 rows at s=256, 2 steps, about 1-2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.memory_worker import worker  # noqa: E402
from bench.report import replace_section  # noqa: E402

SECTION = "## Memory: planner vs measured"
GB = 1e9

#: The benchmark model, a scaled-down Llama whose terms stand well above the resident-set noise.
MODEL_CONFIG = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=8, intermediate_size=1376, vocab_size=8000,
                    tie_word_embeddings=False, attention_dropout=0.0)
#: (sequence length, micro batch)
SHAPES = ((256, 4), (1024, 4))
METHODS = (("lora", 8), ("lora", 64), ("full", None))
#: (method, r, sequence length, checkpointing) left out of the default grid, to keep the run
#: under 6 minutes on 2 idle cores: r changes only the small adapter terms, which the s=256 rows
#: show, and the activations do not depend on it.
SKIPPED = {("lora", 64, 1024, False), ("lora", 64, 1024, True)}
GRID_NOTE = (
    "Two rows fewer than the full 12-row grid, to keep the run under 6 minutes on 2 idle cores: "
    "LoRA r=64 runs at s=256 only (r changes only the small adapter terms, which the s=256 rows "
    "show; the activations are the same as at r=8), leaving the s=1024 rows, 30-45 s each, to "
    "LoRA r=8 and full fine-tuning.")

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
    micro_batch: int

    def label(self) -> str:
        return "full" if self.method == "full" else f"LoRA r={self.r}"


def grid(quick: bool) -> list[Row]:
    if quick:
        return [Row(m, r, gc, 256, 4) for m, r in METHODS[::2] for gc in (False, True)]
    return [Row(m, r, gc, s, b) for s, b in SHAPES for m, r in METHODS for gc in (False, True)
            if (m, r, s, gc) not in SKIPPED]


def grid_note(quick: bool) -> str:
    if quick:
        return "Quick run (`--quick`): s=256 only, LoRA r=64 left out, 2 steps."
    return GRID_NOTE


# --- the worker: one row, in its own process -----------------------------------------------------


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
    from eft.planner import Configuration, PlanSpec, architecture_from_config, estimate_memory
    from eft.planner.memory import layer_activation_bytes

    arch = architecture_from_config(model_dir, name="bench-llama")
    extra = {"lora_r": row.r, "lora_targets": "all-linear"} if row.method == "lora" else {}
    spec = PlanSpec(arch, method=row.method, seq_len=row.seq_len, micro_batch=row.micro_batch,
                    gpus=1, **extra)
    config = Configuration("ddp", gradient_checkpointing=row.checkpointing, attention="sdpa")
    est = estimate_memory(spec, config)
    loss = spec.overheads.logits_bytes * row.seq_len * row.micro_batch * arch.vocab_size / GB
    return {"parameters": est.parameters, "gradients": est.gradients, "optimizer": est.optimizer,
            "activations": est.activations, "overhead": est.overhead, "total": est.total,
            "loss": loss, "theta": arch.parameters, "phi": spec.trainable_parameters,
            "vocab": arch.vocab_size,
            # with checkpointing, the one recomputed layer the activation term adds
            "layer": layer_activation_bytes(spec, config.attention) / GB if row.checkpointing else 0.0}


def comparable(pred: dict[str, float], factors: dict[str, float]) -> float:
    return sum(pred[t] * factors[t] for t in ("parameters", "gradients", "optimizer",
                                               "activations", "loss"))


def run_row(row: Row, model_dir: Path, args: argparse.Namespace, device: str) -> dict:
    spec = {"model_path": str(model_dir), "method": row.method, "r": row.r,
            "checkpointing": row.checkpointing, "seq_len": row.seq_len, "micro_batch": row.micro_batch,
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


def measures(pred: dict[str, float], m: dict, f: dict[str, float], row: Row) -> dict[str, float]:
    """The per-row figures of both tables, GB (NaN where the phase step did not run)."""
    ph = m["phase"]
    nan = float("nan")
    # cross_entropy saves its fp32 log-softmax of the b·(s-1) shifted logits for backward
    log_softmax = 4 * row.micro_batch * (row.seq_len - 1) * pred["vocab"] / GB
    rel = {k: (v - ph["start"]) / GB for k, v in ph.items()} if ph else {}
    return {
        "c16": comparable(pred, {k: 1.0 for k in f}),
        "c32": comparable(pred, f),
        "rss": (m["peak"] - m["baseline"]) / GB,
        "tensors": m["tensor_peak"] / GB if ph else nan,
        "process": m["peak"] / GB,
        # what a forward keeps: with checkpointing, the planner's activations less its one
        # recomputed layer (that one lives in backward and is in the step peak)
        "act_pred": (pred["activations"] - pred["layer"]) * f["activations"],
        "act_meas": rel["forward"] - log_softmax if ph else nan,
        "grad_pred": pred["gradients"] * f["gradients"],
        "grad_meas": rel["backward"] if ph else m["grad_bytes"] / GB,
        "adam_pred": pred["optimizer"] * f["optimizer"],
        "adam_meas": m["optimizer_bytes"] / GB,
        "step_pred": (pred["gradients"] * f["gradients"] + pred["activations"] * f["activations"]
                      + pred["loss"] * f["loss"]),
        "step_meas": rel["step_peak"] if ph else nan,
        "rss_load": (m["after_load"] - m["baseline"]) / GB,
    }


def render(info: dict[str, str], rows: list[tuple[Row, dict, dict]], args: argparse.Namespace,
           device: str, elapsed: float, cpu_s: float, load: tuple[float, float], theta: int,
           note: str) -> str:
    f = FACTORS[args.precision]
    cuda = device == "cuda"
    onoff = {False: "off", True: "on"}
    lines = [
        SECTION, "",
        f"Written by `bench/memory.py` (`make bench`) on {time.strftime('%Y-%m-%d %H:%M %Z')}; "
        f"whole run {elapsed:.0f} s wall, {cpu_s:.0f} s CPU in the row processes, load average "
        f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (the cores are shared: wall time "
        "stretches with the load, the CPU time does not). The script's docstring says how it "
        "measures, and what.", "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".", "",
        f"Model: Llama built from a config, hidden {MODEL_CONFIG['hidden_size']}, "
        f"{MODEL_CONFIG['num_hidden_layers']} layers, {MODEL_CONFIG['num_attention_heads']} heads, "
        f"intermediate {MODEL_CONFIG['intermediate_size']}, vocabulary {MODEL_CONFIG['vocab_size']}, "
        f"θ = {theta / 1e6:.2f}M parameters, saved with `save_pretrained` and loaded with "
        f"`load_trainable_model` ({args.precision}, sdpa attention). {args.steps} training steps "
        f"per row (AdamW, clipping at 1.0) on one worker, {'the GPU' if cuda else 'the CPU'} with "
        f"{args.threads} threads, each row in a fresh process. LoRA: all-linear, alpha 16, dropout "
        "0.05 (the service's defaults). " + note, "",
        "Units: GB = 10^9 bytes. The planner's terms are as `estimate_memory` gives them (16-bit "
        "mixed precision; strategy `ddp`, one GPU, sdpa). *Comparable* = parameters + gradients "
        "+ optimizer + activations + the loss buffers (8·s·b·V bytes, the one part of the "
        "overhead term that exists here); the rest of the overhead (0.5 GB CUDA context, 2φ of "
        "DDP buckets) has no counterpart in one CPU process and is left out of it. *fp32 eq.* "
        f"converts the comparable terms to this run's {args.precision} training: parameters "
        f"×{f['parameters']:g}, gradients ×{f['gradients']:g}, optimizer ×{f['optimizer']:.3g} "
        f"(AdamW keeps 8 bytes per fp32 weight, the planner counts 12), activations "
        f"×{f['activations']:g}, loss ×{f['loss']:g}. *Measured* = "
        + ("the CUDA allocator's peak − its bytes before the model" if cuda else
           "peak resident set (`ru_maxrss`) − resident set (VmRSS) after imports and warm-up, "
           "before the model") + ". *Tensors* = "
        + ("the same (the allocator counts tensors only)" if cuda else
           "weights + AdamW states + the highest point of the profiled step's live bytes above "
           "its start: tensors only, without what malloc keeps after frees")
        + ". *Process peak* = `ru_maxrss` itself, what the training loop reports as "
        "`peak_memory_gb` on CPU, against which the service sets the planner total.", "",
        "| method | GC | s × b | φ | params | grads | optim | activ | overhead | planner total | "
        "comparable | fp32 eq. | measured | **fp32 eq. / measured** | comparable / measured | "
        "tensors | fp32 eq. / tensors | process peak | planner total / process peak |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    stats = []
    for row, pred, m in rows:
        x = measures(pred, m, f, row)
        stats.append((row, x, m))
        lines.append(
            f"| {row.label()} | {onoff[row.checkpointing]} | {row.seq_len} × {row.micro_batch} | "
            f"{m['trainable_parameters'] / 1e6:.2f}M | {g(pred['parameters'])} | "
            f"{g(pred['gradients'])} | {g(pred['optimizer'])} | {g(pred['activations'])} | "
            f"{g(pred['overhead'])} | {g(pred['total'])} | {g(x['c16'])} | {g(x['c32'])} | "
            f"{g(x['rss'])} | **{x['c32'] / x['rss']:.2f}** | {x['c16'] / x['rss']:.2f} | "
            f"{g(x['tensors'])} | {x['c32'] / x['tensors']:.2f} | {g(x['process'])} | "
            f"{pred['total'] / x['process']:.2f} |")
    lines += [
        "",
        "### Per term",
        "",
        "One more step after the measured ones (optimizer states exist, gradients were freed), "
        "read from the " + ("CUDA allocator" if cuda else "profiler's record of every allocation "
        "and free (it runs after the peak was read: its event buffers inflate the resident set)")
        + " at the boundaries of its phases; predictions converted as above. *Activations*: "
        "growth across the forward pass, less the log-softmax that cross-entropy saves "
        "(4·b·(s−1)·V bytes), against activations ×2; with checkpointing the forward keeps only "
        "the layer inputs, so the planner's one recomputed layer is taken out of the prediction "
        "here (it lives in backward, and is in the step peak). "
        "*Gradients*: live bytes after backward − before forward. *AdamW*: bytes of the "
        "optimizer's state tensors. *Step peak*: the step's highest point above its start "
        "(gradients, activations, loss buffers and temporaries together), against gradients + "
        "activations + loss. *RSS after load*: resident set after `load_trainable_model` − "
        "baseline.",
        "",
        "| method | GC | s × b | activ. pred. | activ. meas. | pred. / meas. | grads pred. | grads "
        "meas. | AdamW pred. | AdamW meas. | step peak pred. | step peak meas. | pred. / meas. | "
        "RSS after load | load s | train s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, x, m in stats:
        lines.append(
            f"| {row.label()} | {onoff[row.checkpointing]} | {row.seq_len} × {row.micro_batch} | "
            f"{g(x['act_pred'])} | {g(x['act_meas'])} | {x['act_pred'] / x['act_meas']:.2f} | "
            f"{g(x['grad_pred'])} | {g(x['grad_meas'])} | {g(x['adam_pred'])} | "
            f"{g(x['adam_meas'])} | {g(x['step_pred'])} | {g(x['step_meas'])} | "
            f"{x['step_pred'] / x['step_meas']:.2f} | {g(x['rss_load'])} | {m['load_s']:.1f} | "
            f"{m['train_s']:.1f} |")
    ratios = [x["c32"] / x["rss"] for _, x, _ in stats]
    tensor_ratios = [x["c32"] / x["tensors"] for _, x, _ in stats]
    kept = [x["rss"] - x["tensors"] for _, x, _ in stats]
    baselines = [m["baseline"] / GB for _, _, m in stats]
    worst = stats[kept.index(max(kept))][0]
    lines += ["", "### Reading the ratios", "",
              f"Over these rows fp32 eq. / measured runs from {min(ratios):.2f} to "
              f"{max(ratios):.2f} and fp32 eq. / tensors from {min(tensor_ratios):.2f} to "
              f"{max(tensor_ratios):.2f}; measured − tensors (what malloc keeps) is "
              f"{min(kept):.2f}–{max(kept):.2f} GB (the most for {worst.label()}, checkpointing "
              f"{onoff[worst.checkpointing]}, s={worst.seq_len}), and the process before the model "
              f"{min(baselines):.2f}–{max(baselines):.2f} GB. " + " ".join(READING.split()), ""]
    return "\n".join(lines)


READING = """
A ratio above 1 means the planner over-predicts this run (on a GPU it would refuse jobs that fit,
or switch on optimizations they do not need), below 1 that it under-predicts (it would admit a job
that runs out of memory). fp32 eq. / measured tests the formulas against the process; comparable /
measured is what the planner's 16-bit numbers say about a CPU job as they stand; fp32 eq. / tensors
leaves malloc out. The per-term table says where a miss comes from. Gradients and AdamW states are
byte counts and agree once converted (AdamW over fp32 weights keeps 8φ, not the planner's 12φ).
The activation term is off, in both directions. It has no LoRA part: PEFT applies its dropout
(0.05 by default) to the input of every adapted linear, each a fresh copy saved with its mask, so
a LoRA layer keeps about half as much again as a fully fine-tuned one and the planner
under-predicts LoRA at short sequences. Its quadratic 5·a·s/h part counts attention scores that
sdpa's fused CPU kernel never stores: from s=256 to s=1024 the measured activations grow 4x, in
step with the tokens, while the prediction grows 8.4x, so it over-predicts long sequences (the
planner counts sdpa like eager on GPUs too, where the flash and memory-efficient sdpa kernels do
not store the scores either), and the one layer it adds for checkpointing carries the same
quadratic part. With checkpointing the forward keeps the L layer inputs the planner models, plus
the embeddings' output and the rotary tables. Outside the tensors, the resident set holds what glibc malloc keeps of freed memory,
which no planner term covers on CPU, and the process itself (interpreter, torch, Ray's imports)
holds the baseline: planner total / process peak compares the prediction with what a CPU job
reports as `peak_memory_gb`, and it comes out below 1 because CPU jobs train in fp32 while the
planner assumes 16-bit mixed precision.
"""


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
    load_start = os.getloadavg()[0]
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
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    section = render(info, results, args, device, time.perf_counter() - started,
                     children.ru_utime + children.ru_stime, (load_start, os.getloadavg()[0]), theta,
                     grid_note(args.quick))
    replace_section(args.output, SECTION, section)
    print(section)
    print(f"\nwrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
