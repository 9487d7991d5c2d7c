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
2. Asks the planner (`architecture_from_config` on that directory, `PlanSpec` for a CPU job,
   `Configuration("ddp", gradient_checkpointing=..., attention="sdpa")`, `estimate_memory`), in
   the same run, for every row of the grid: LoRA r=8 / LoRA r=64 (all-linear; alpha 16 and
   dropout 0.05, the case with the most to count: the service's default dropout is 0) / full fine-tuning, x gradient checkpointing off / on,
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
the model and its training add to the process: weights, LoRA adapters, gradients, AdamW states,
saved activations, logits and loss buffers, and temporaries alive at the peak. The row processes
run with glibc's mmap threshold fixed at 64 KiB (`MALLOC_MMAP_THRESHOLD_`, `ALLOCATOR_ENV`), so a
freed tensor's pages go back to the system at once. With the default, dynamic threshold, malloc
keeps freed blocks of up to 32 MB in its heap and the resident set holds 0.3-1.9 GB more than the
tensors on these rows: allocator policy, not memory the code allocates. (Training workers keep
the default: the fixed threshold costs about 40% of a CPU step here, every allocation faulting
fresh pages; at 1 MiB the LoRA r=64 matrices, 128-352 KB each, stay in the heap and it keeps
about 25 MB more.) *Tensors* is the same without the allocator: weights + AdamW states + the highest
point of the profiled step's live bytes above its start. *Process peak* is ru_maxrss itself, what
`training.steps.peak_memory_gb` reports on CPU.

The prediction is the planner's own total for the job the row runs: `PlanSpec(precision="fp32",
device="cpu", gradient_accumulation=False)`, as the service plans a CPU job (CPU jobs train in
fp32; one worker has no CUDA context and no DDP buckets, so the overhead term is 0). No term is
converted or left out.

GPU: where CUDA is available (and `--device cpu` is not given), the worker moves the loaded model
to the GPU and reads the CUDA allocator instead: baseline `memory_allocated` before the move,
`reset_peak_memory_stats`, peak `max_memory_allocated`; the per-term step reads
`memory_allocated` at the phase boundaries. `--precision bf16` runs under autocast as the DDP
strategy does, planned with `precision="bf16", device="cuda"`. Written, but not run on the CPU
machines here.

Runtime: about 6 minutes on 2 idle cores (10 rows; each pays ~10 s of imports, warm-up and
loading, then 4 steps: ~15 s a row at s=256, 40-60 s at s=1024), two to three times that when
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

#: The allocator setting of the row processes: freed tensors return their pages at once.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 10)}
PRECISIONS = ("fp32", "bf16")


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


def plan_spec(model_dir: Path, row: Row, precision: str, device: str):
    """The planning question of the job a row runs: one worker, no gradient accumulation."""
    from eft.planner import PlanSpec, architecture_from_config

    arch = architecture_from_config(model_dir, name="bench-llama")
    extra = {"lora_r": row.r, "lora_targets": "all-linear", "lora_dropout": 0.05} if row.method == "lora" else {}
    return PlanSpec(arch, method=row.method, seq_len=row.seq_len, micro_batch=row.micro_batch,
                    gpus=1, precision=precision, device=device, gradient_accumulation=False, **extra)


def predict(model_dir: Path, row: Row, precision: str, device: str) -> dict[str, float]:
    """The planner's terms for `row` in GB, and the parts the per-term table compares."""
    from eft.planner import Configuration, estimate_memory
    from eft.planner.memory import forward_bytes, layer_activation_bytes, loss_bytes

    spec = plan_spec(model_dir, row, precision, device)
    config = Configuration("ddp", gradient_checkpointing=row.checkpointing, attention="sdpa")
    est = estimate_memory(spec, config)
    return {"parameters": est.parameters, "gradients": est.gradients, "optimizer": est.optimizer,
            "activations": est.activations, "overhead": est.overhead, "total": est.total,
            "forward": forward_bytes(spec, config) / GB, "loss": loss_bytes(spec) / GB,
            "layer": layer_activation_bytes(spec, config.attention) / GB,
            "update": (est.gradients + est.update_temporaries),
            "theta": spec.architecture.parameters, "phi": spec.trainable_parameters,
            "vocab": spec.architecture.vocab_size}


def run_row(row: Row, model_dir: Path, args: argparse.Namespace, device: str) -> dict:
    spec = {"model_path": str(model_dir), "method": row.method, "r": row.r,
            "checkpointing": row.checkpointing, "seq_len": row.seq_len, "micro_batch": row.micro_batch,
            "steps": args.steps, "threads": args.threads, "device": device,
            "precision": args.precision}
    env = dict(os.environ, **(ALLOCATOR_ENV if device == "cpu" else {}),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"worker for {row} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def g(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def measures(pred: dict[str, float], m: dict, row: Row) -> dict[str, float]:
    """The per-row figures of both tables, GB (NaN where the phase step did not run)."""
    ph = m["phase"]
    nan = float("nan")
    # what the loss keeps from the forward: the logits' gradient (fp32 here), written as it goes
    loss_grad = 4 * row.micro_batch * row.seq_len * pred["vocab"] / GB
    rel = {k: (v - ph["start"]) / GB for k, v in ph.items()} if ph else {}
    return {
        "rss": (m["peak"] - m["baseline"]) / GB,
        "tensors": m["tensor_peak"] / GB if ph else nan,
        "process": m["peak"] / GB,
        "act_pred": pred["forward"],
        "act_meas": rel["forward"] - loss_grad if ph else nan,
        "grad_meas": rel["backward"] if ph else m["grad_bytes"] / GB,
        "adam_meas": m["optimizer_bytes"] / GB,
        # the step's high point above its start: activations and loss buffers (or the recomputed
        # layer), or the gradients, whichever is larger
        "step_pred": max(pred["activations"], pred["update"]),
        "step_meas": rel["step_peak"] if ph else nan,
        "rss_load": (m["after_load"] - m["baseline"]) / GB,
    }


def render(info: dict[str, str], rows: list[tuple[Row, dict, dict]], args: argparse.Namespace,
           device: str, elapsed: float, cpu_s: float, load: tuple[float, float], theta: int,
           note: str) -> str:
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
        "0.05 (the case with the most to count: every adapted linear keeps a dropout mask and output; "
        "the service's default dropout is 0). " + note, "",
        "Units: GB = 10^9 bytes. *Planner*: `estimate_memory` for the job the row runs, planned as "
        f"the service plans it (`precision=\"{args.precision}\"`, `device=\"{device}\"`, one "
        "worker, no gradient accumulation), its terms as given; its total is the prediction, "
        "compared as it is. *Measured* = "
        + ("the CUDA allocator's peak − its bytes before the model" if cuda else
           "peak resident set (`ru_maxrss`) − resident set (VmRSS) after imports and warm-up, "
           "before the model, with glibc returning freed pages at once "
           f"(`MALLOC_MMAP_THRESHOLD_={ALLOCATOR_ENV['MALLOC_MMAP_THRESHOLD_']}`)") + ". *Tensors* = "
        + ("the same (the allocator counts tensors only)" if cuda else
           "weights + AdamW states + the highest point of the profiled step's live bytes above "
           "its start: tensors only") + ". *Process peak* = `ru_maxrss` itself, the interpreter and "
        "libraries included: what the training loop reports as `peak_memory_gb` on CPU.", "",
        "| method | GC | s × b | φ | params | grads | optim | activ | overhead | **planner** | "
        "measured | **planner / measured** | tensors | planner / tensors | process peak |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    stats = []
    for row, pred, m in rows:
        x = measures(pred, m, row)
        stats.append((row, pred, x, m))
        lines.append(
            f"| {row.label()} | {onoff[row.checkpointing]} | {row.seq_len} × {row.micro_batch} | "
            f"{m['trainable_parameters'] / 1e6:.2f}M | {g(pred['parameters'])} | "
            f"{g(pred['gradients'])} | {g(pred['optimizer'])} | {g(pred['activations'])} | "
            f"{g(pred['overhead'])} | **{g(pred['total'])}** | {g(x['rss'])} | "
            f"**{pred['total'] / x['rss']:.2f}** | {g(x['tensors'])} | "
            f"{pred['total'] / x['tensors']:.2f} | {g(x['process'])} |")
    lines += [
        "",
        "### Per term",
        "",
        "One more step after the measured ones (optimizer states exist, gradients were freed), "
        "read from the " + ("CUDA allocator" if cuda else "profiler's record of every allocation "
        "and free (it runs after the peak was read: its event buffers inflate the resident set)")
        + " at the boundaries of its phases. *Forward*: growth across the forward pass, less the "
        "logits' gradient that the chunked loss writes in its forward (4·b·s·V bytes), against `forward_bytes` "
        "(every layer's saved tensors, or with checkpointing the layer inputs, and the final "
        "norm's). *Gradients*: live bytes after backward − before forward. *AdamW*: bytes of the "
        "optimizer's state tensors. *Step peak*: the step's highest point above its start, "
        "against the larger of the activation term (forward + the loss buffers: the logits and their "
        "gradient, 8·s·b·V bytes in fp32, which works on each chunk of tokens in the gradient's buffer; "
        "or the layer checkpointing recomputes) and the gradients. *RSS after load*: resident set "
        "after `load_trainable_model` − baseline.",
        "",
        "| method | GC | s × b | forward pred. | forward meas. | pred. / meas. | grads pred. | grads "
        "meas. | AdamW pred. | AdamW meas. | step peak pred. | step peak meas. | pred. / meas. | "
        "RSS after load | load s | train s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, pred, x, m in stats:
        lines.append(
            f"| {row.label()} | {onoff[row.checkpointing]} | {row.seq_len} × {row.micro_batch} | "
            f"{g(x['act_pred'])} | {g(x['act_meas'])} | {x['act_pred'] / x['act_meas']:.2f} | "
            f"{g(pred['gradients'])} | {g(x['grad_meas'])} | {g(pred['optimizer'])} | "
            f"{g(x['adam_meas'])} | {g(x['step_pred'])} | {g(x['step_meas'])} | "
            f"{x['step_pred'] / x['step_meas']:.2f} | {g(x['rss_load'])} | {m['load_s']:.1f} | "
            f"{m['train_s']:.1f} |")
    ratios = [pred["total"] / x["rss"] for _, pred, x, _ in stats]
    tensor_ratios = [pred["total"] / x["tensors"] for _, pred, x, _ in stats]
    kept = [x["rss"] - x["tensors"] for _, _, x, _ in stats]
    baselines = [m["baseline"] / GB for _, _, _, m in stats]
    lines += ["", "### Reading the ratios", "",
              f"Over these rows planner / measured runs from {min(ratios):.2f} to "
              f"{max(ratios):.2f}, and planner / tensors from {min(tensor_ratios):.2f} to "
              f"{max(tensor_ratios):.2f}; measured − tensors is {min(kept):.3f}–{max(kept):.3f} GB, "
              f"and the process before the model {min(baselines):.2f}–{max(baselines):.2f} GB. "
              + " ".join(READING.split()), ""]
    return "\n".join(lines)


READING = """
A ratio above 1 means the planner over-predicts this run (on a GPU it would refuse jobs that fit,
or switch on optimizations they do not need), below 1 that it under-predicts (it would admit a job
that runs out of memory). The per-term table says where a miss comes from. Weights, gradients and
AdamW states are byte counts (4θ or 4θ + 4φ, 4φ, 8φ in fp32). The activations are counted per
operation, from what autograd saves in a Llama layer: with LoRA every adapted linear keeps its
dropout's noise tensor and output (on the CPU dropout multiplies by a full-size noise tensor),
frozen linears and norms keep nothing for their weights, and sdpa stores no attention scores, so
the activations grow with the tokens, not with their square. The loss is computed in chunks of
tokens and writes the logits' gradient as it goes: at its peak the logits and their gradient (2·e
bytes per token and vocabulary entry; with 16-bit logits also one chunk's fp32 copy), never a
whole micro-batch's fp32 logits and log-softmax;
with checkpointing, the one layer recomputed in backward (its activations, and the gradients of
its MLP's gate and up outputs, which its backward holds at once) never coexists with it, and the larger
counts. Without gradient accumulation the gradients appear in backward as the activations are
freed: the step's peak holds the activations or the gradients, not both. The planner leaves out
the process itself (interpreter, torch and Ray's imports: the baseline), which the process peak
includes.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=3, help="training steps per row (default 3)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch threads per row (default: the usable cores)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
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
            pred = predict(model_dir, row, args.precision, device)
            t0 = time.perf_counter()
            m = run_row(row, model_dir, args, device)
            measured = (m["peak"] - m["baseline"]) / GB
            print(f"[{i}/{len(rows)}] {row.label():10} GC {'on ' if row.checkpointing else 'off'} "
                  f"s={row.seq_len:<5} measured {measured:.3f} GB, planner {pred['total']:.3f} GB "
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
