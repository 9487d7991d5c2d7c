"""One row of bench/memory.py, measured in a process of its own (`bench/memory.py --worker`):
builds the row's model and strategy as a job's worker does, trains a few steps under the torch
profiler, and returns the peak memory with the allocation curve around it.
"""

from __future__ import annotations

import time

def _vmrss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _allocation_curve(prof) -> tuple[list[int], list[int]]:
    """(times, bytes): the CPU allocator's live bytes after each allocation or free the
    profiler saw, relative to when it started (what `max_memory_allocated` is on a GPU)."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type().name == "CPU")
    times, live, total = [], [], 0
    for ns, nbytes in events:
        total += nbytes
        times.append(ns)
        live.append(total)
    return times, live


def _marks(prof) -> dict[str, tuple[int, int]]:
    """Start and end (ns) of every `bench.*` record_function range."""
    return {e.name(): (e.start_ns(), e.start_ns() + e.duration_ns())
            for e in prof.profiler.kineto_results.events() if e.name().startswith("bench.")}


def worker(spec: dict) -> dict:
    """Load the model of `spec` through the service's path, train `steps` steps, return memory."""
    import bisect
    import contextlib
    import gc

    import peft  # noqa: F401 - imported before the baseline: code is not what we measure
    import torch
    import transformers  # noqa: F401
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers.models.llama import modeling_llama  # noqa: F401

    from eft.training.config import LoraSpec, TrainConfig
    from eft.training.steps import token_loss_sum
    from eft.training.model import load_trainable_model

    torch.set_num_threads(spec["threads"])
    use_cuda = spec["device"] == "cuda"
    device = torch.device("cuda" if use_cuda else "cpu")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[spec["precision"]]

    def autocast():  # as the DDP strategy does
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    # Warm-up: initialise the kernels, thread pools, allocator paths and the profiler on a toy
    # model, so that their one-off memory sits in the baseline and not in the row's share.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) if not use_cuda else \
            contextlib.nullcontext():
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

    def resident() -> int:
        return torch.cuda.memory_allocated(device) if use_cuda else _vmrss_bytes()

    if use_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    baseline = resident()

    # Dropout 0.05, as the planner is asked (bench/memory.py): the case where every adapted
    # linear keeps a dropout mask and output (the service's default is 0).
    lora = LoraSpec(r=spec["r"], dropout=0.05) if spec["method"] == "lora" else None
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
    after_load = resident()
    load_peak = torch.cuda.max_memory_allocated(device) if use_cuda else _maxrss_bytes()
    load_s = time.perf_counter() - started

    trainable = [p for p in model.parameters() if p.requires_grad]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    model.train()
    vocab = model.config.vocab_size
    b, s = spec["micro_batch"], spec["seq_len"]
    generator = torch.Generator().manual_seed(cfg.seed)

    def step(i: int, phase: dict[str, int] | None = None) -> None:
        """One training step as the DDP strategy runs it on one worker; fills `phase` (GPU)
        with the allocated bytes at its boundaries."""

        def mark(name: str) -> None:
            if use_cuda and phase is not None:
                torch.cuda.synchronize()
                phase[name] = torch.cuda.memory_allocated(device)

        ids = torch.randint(0, vocab, (b, s), generator=generator).to(device)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        mark("start")
        with record_function(f"bench.forward.{i}"), autocast():
            loss = token_loss_sum(model, batch) / (b * (s - 1))
        mark("forward")
        with record_function(f"bench.backward.{i}"):
            loss.backward()
        mark("backward")
        phase_grads.append(sum(p.grad.numel() * p.grad.element_size()
                               for p in trainable if p.grad is not None))
        with record_function(f"bench.optimizer.{i}"):
            torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm or 1.0)
            optimizer.step()
        mark("optimizer")
        optimizer.zero_grad(set_to_none=True)

    # 1. The measured run: `steps` steps, nothing else in the process.
    phase_grads: list[int] = []
    started = time.perf_counter()
    for i in range(spec["steps"]):
        step(i)
    if use_cuda:
        torch.cuda.synchronize()
    train_s = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) if use_cuda else _maxrss_bytes()
    status = {}
    if not use_cuda:
        with open("/proc/self/status") as fh:
            status = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in fh)
                      if k in ("VmRSS", "RssAnon", "RssFile")}
    optimizer_bytes = sum(v.numel() * v.element_size() for state in optimizer.state.values()
                          for v in state.values() if torch.is_tensor(v))

    # 2. One more step, split by phase: read from the CUDA allocator, or on CPU from the
    # profiler's record of every allocation and free (its event buffers inflate the resident
    # set, which is why it runs only after the peak above was read).
    phase: dict[str, int] = {}
    if use_cuda:
        torch.cuda.reset_peak_memory_stats(device)
        step(spec["steps"], phase)
        phase["step_peak"] = torch.cuda.max_memory_allocated(device)
        tensor_peak = peak - baseline
    elif spec.get("profile", True):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step(spec["steps"])
        times, live = _allocation_curve(prof)
        marks = _marks(prof)
        i = spec["steps"]

        def at(ns: int) -> int:  # live bytes just before `ns`, relative to the profiler's start
            k = bisect.bisect_left(times, ns)
            return live[k - 1] if k else 0

        first, last = marks[f"bench.forward.{i}"][0], marks[f"bench.optimizer.{i}"][1]
        phase = {"start": at(first), "forward": at(marks[f"bench.forward.{i}"][1]),
                 "backward": at(marks[f"bench.backward.{i}"][1]),
                 "step_peak": max(live[bisect.bisect_left(times, first):bisect.bisect_left(times, last)],
                                  default=0)}
        # Before the curve: the weights (mostly mapped from the file) and the AdamW states.
        tensor_peak = weight_bytes + optimizer_bytes + phase["step_peak"] - phase["start"]
    else:
        tensor_peak = 0
    return {
        "baseline": baseline, "after_load": after_load, "load_peak": load_peak, "peak": peak,
        "tensor_peak": tensor_peak, "weight_bytes": weight_bytes, "optimizer_bytes": optimizer_bytes,
        "grad_bytes": max(phase_grads), "phase": phase, "status_after": status,
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "load_s": load_s, "train_s": train_s, "memory": "cuda allocator" if use_cuda else "RSS",
    }


# --- the driver ----------------------------------------------------------------------------------
