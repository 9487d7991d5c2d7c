"""`eft plan`: predict memory per GPU of every configuration and choose the fastest that fits.

    eft plan --model llama-2-70b --method lora --gpus 8 --gpu-memory 32 --seq-len 4096
    eft plan --model ./my-model --method qlora --gpus 2 --gpu-memory 16 --json
    eft plan --model tiny-llama --gpus 1 --gpu-memory 8 --remote   # ask the service instead

The planner is pure Python in the client package (eft/planner), so this runs offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eft import planner
from eft._config import model_roots
from eft.cli.output import AsJson, CliError, MethodName, StrategyName, client_of, emit_json, out
from eft.types.plans import Plan, PlanCandidate, PlanRequest

def _local_architecture(model: str) -> planner.Architecture:
    """A known name, a model directory or config.json path, or a model under an allowed root."""
    known = planner.known_architecture(model)
    if known is not None:
        return known
    candidates = [Path(model).expanduser()]
    if not candidates[0].exists():
        candidates = [root / model for root in model_roots()]
    for path in candidates:
        if path.is_file() or (path / "config.json").is_file():
            return planner.architecture_from_config(path, name=model)
    raise CliError(f"unknown model {model!r}: name a known architecture "
                   f"({', '.join(planner.KNOWN_ARCHITECTURES)}), a directory holding a config.json, "
                   "or a config.json file", exit_code=2)


def plan_locally(request: PlanRequest) -> Plan:
    """Run the planner in this process (pure Python: no server, no torch) and return its Plan."""
    try:
        architecture = _local_architecture(request.model)
        spec = planner.PlanSpec.from_request(request, request.cluster, architecture)
        return Plan.model_validate(planner.plan(spec).to_dict())
    except planner.PlannerError as exc:
        raise CliError(f"{exc.param}: {exc}", exit_code=2) from None


def _config_label(c: PlanCandidate) -> str:
    """A compact label, e.g. 'zero3+opt GC fa2' (offload optimizer, checkpointing, flash-attn 2)."""
    offload = {"none": "", "optimizer": "+opt", "optimizer+params": "+opt+par"}[c.offload]
    attention = {"flash_attention_2": "fa2"}.get(c.attention, c.attention)
    return f"{c.strategy}{offload}{' GC' if c.gradient_checkpointing else ''} {attention}"


def _short_reason(c: PlanCandidate, chosen: PlanCandidate | None, capacity: float) -> str:
    if c == chosen:
        return "chosen: fastest that fits"
    if c.fits:
        slower = (c.relative_time / chosen.relative_time - 1) * 100 if chosen else 0.0
        return f"fits, {slower:.0f}% slower"
    m = c.memory_gb
    terms = {"params": m.parameters, "grads": m.gradients, "optim": m.optimizer,
             "activ": m.activations, "overhead": m.overhead}
    return f"{m.total - capacity:.1f} GB over ({max(terms, key=terms.__getitem__)})"


def _plan_table(result: Plan, capacity: float) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("configuration", no_wrap=True)
    for name in ("params", "grads", "optim", "activ", "overhead", "gpu", "total", "fits", "time"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("reason")
    for c in result.candidates:
        chosen = c == result.chosen
        m = c.memory_gb
        cells = [("▶ " if chosen else "  ") + _config_label(c),
                 # gpu: the caching allocator's reserve and NCCL's buffers (none on the CPU)
                 *(f"{v:.2f}" for v in (m.parameters, m.gradients, m.optimizer, m.activations,
                                        m.overhead, m.reserve + m.communicator, m.total)),
                 "yes" if c.fits else "no", f"{c.relative_time:.2f}",
                 _short_reason(c, result.chosen, capacity)]
        style = "bold green" if chosen else ("" if c.fits else "dim")
        table.add_row(*(Text(cell, style=style) for cell in cells))
    return table


def _show_plan(result: Plan, request: PlanRequest) -> None:
    cluster, model = request.cluster, result.model
    if model is not None:
        out.print(Text(f"{model.name}: {model.parameters / 1e9:.2f}B parameters, {model.method} "
                       f"training {model.trainable_parameters / 1e6:,.1f}M; "
                       f"{cluster.gpus} x {cluster.gpu_memory_gb:g} GB GPUs"
                       f"{' (' + cluster.gpu_type + ')' if cluster.gpu_type else ''}, "
                       f"seq {request.hyperparameters.max_seq_len}, "
                       f"micro batch {request.hyperparameters.micro_batch_size}"), soft_wrap=True)
    out.print(Text("memory per GPU in GB (10^9 bytes); time relative to ddp + sdpa; +opt/+opt+par: "
                   "CPU offload of optimizer/and parameters; GC: gradient checkpointing; fa2: "
                   "flash_attention_2", style="dim"), soft_wrap=True)
    table = _plan_table(result, cluster.gpu_memory_gb)
    # At its natural width even on a narrow terminal: cut-off numbers would mislead.
    natural = out.measure(table, options=out.options.update_width(160)).maximum
    (out if natural <= out.width else Console(width=natural)).print(table)
    if result.chosen is None:
        out.print(Text("nothing fits.", style="bold red"))
        for suggestion in result.suggestions:
            out.print(Text(f"  - {suggestion.message}"))
    else:
        c = result.chosen
        label = " + ".join([c.strategy, *([f"offload {c.offload}"] if c.offload != "none" else []),
                            *(["gradient checkpointing"] if c.gradient_checkpointing else []),
                            c.attention])
        out.print(Text("chosen: ", style="bold") + Text(label, style="bold green")
                  + Text(f" ({c.memory_gb.total:.1f} GB per GPU, relative time {c.relative_time:.2f})"),
                  soft_wrap=True)
        for line in [c.reason, *result.why]:
            out.print(Text(f"  - {line}"), soft_wrap=True)
    for note in result.notes:
        out.print(Text(f"note: {note}", style="dim"), soft_wrap=True)


def plan(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="Known architecture (e.g. llama-2-70b), or a model "
                                            "directory or config.json path.")],
    gpu_memory: Annotated[float, typer.Option(help="Memory of one GPU, GB (10^9 bytes).", min=0.001)],
    gpus: Annotated[int, typer.Option(min=1, help="GPUs the job trains on.")] = 1,
    method: Annotated[MethodName, typer.Option()] = MethodName("lora"),
    lora_r: Annotated[int, typer.Option(min=1, help="LoRA rank.")] = 8,
    target_modules: Annotated[str, typer.Option(help="Comma list or all-linear.")] = "all-linear",
    seq_len: Annotated[int, typer.Option(min=1, help="Tokens per sequence.")] = 512,
    micro_batch: Annotated[int, typer.Option(min=1, help="Sequences per GPU per forward pass "
                                                         "(1, as in the study).")] = 1,
    gpu_type: Annotated[str | None, typer.Option(help="e.g. V100, A100, H100: decides whether "
                                                      "flash_attention_2 is considered.")] = None,
    strategy: Annotated[StrategyName,
                        typer.Option(help="auto weighs every strategy.")] = StrategyName("auto"),
    remote: Annotated[bool, typer.Option("--remote", help="Ask the service (POST /plan) instead "
                                                          "of planning in this process.")] = False,
    as_json: AsJson = False,
) -> None:
    """Predict memory per GPU of each configuration and choose the fastest that fits:
    `eft plan --model llama-2-70b --method lora --gpus 8 --gpu-memory 32 --seq-len 4096`.

    Runs locally (no server needed) unless --remote. Exits 1 when nothing fits."""
    body: dict[str, Any] = {
        "model": model, "strategy": strategy.value, "method": {"type": method.value},
        "hyperparameters": {"max_seq_len": seq_len, "micro_batch_size": micro_batch,
                            "global_batch_size": max(micro_batch, 8)},
        "cluster": {"gpus": gpus, "gpu_memory_gb": gpu_memory, "gpu_type": gpu_type},
    }
    if method.value != "full":
        targets = target_modules if target_modules == "all-linear" else \
            [m.strip() for m in target_modules.split(",") if m.strip()]
        body["method"].update(r=lora_r, target_modules=targets)
    request = PlanRequest.model_validate(body)
    result = client_of(ctx).plan(request) if remote else plan_locally(request)
    if as_json:
        emit_json(result)
    else:
        _show_plan(result, request)
    if result.chosen is None:
        raise typer.Exit(1)


COMMANDS = {"plan": plan}
