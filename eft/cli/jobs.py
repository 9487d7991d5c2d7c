"""`eft jobs create|list|get|cancel|pause|resume|events|checkpoints`."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from eft.cli.output import (AsJson, CliError, JobId, MethodName, StrategyName, client_of, emit_json, out, progress_text,
                            status_text, table, time_text)
from collections.abc import Callable

from eft.cli.watch import wait_and_report
from eft.types.jobs import Job, JobCreate, JobStatus, LoraMethod, tuning_of
from eft.types.text import decimal_int

def _show_job(job: Job, as_json: bool) -> None:
    if as_json:
        return emit_json(job)
    tuning = tuning_of(job.method)
    method = tuning.type + (f" r={tuning.r}" if isinstance(tuning, LoraMethod) else "")
    if tuning is not job.method:
        method = f"{job.method.type} (beta={job.method.beta}) with {method}"
    scaling = job.scaling
    rows = [
        ("id", job.id), ("name", job.name or "-"), ("status", status_text(job)), ("model", job.model),
        ("training file", job.training_file), ("method", method), ("strategy", job.strategy),
        ("workers", f"{job.num_workers or '-'} (of {scaling.min_workers}"
                    f"..{scaling.resolved_max_workers})"),
        ("progress", progress_text(job)), ("created", time_text(job.created_at)),
        ("finished", time_text(job.finished_at)), ("artifact", job.artifact_path or "-"),
    ]
    if job.queue:
        start = f", start ~{time_text(job.queue.estimated_start)}" if job.queue.estimated_start else ""
        rows.append(("queue", f"#{job.queue.position}: {job.queue.reason}{start}"))
    if job.error:
        rows.append(("error", f"{job.error.code}: {job.error.message}"))
    out.print(table("", "", rows=rows))


# Flag of `jobs create` -> (section of JobCreate, field); "" is the top level.
CREATE_FIELDS = {
    "model": ("", "model"), "training_file": ("", "training_file"),
    "validation_file": ("", "validation_file"), "strategy": ("", "strategy"), "name": ("", "name"),
    "priority": ("", "priority"),
    "method": ("method", "type"), "r": ("method", "r"), "alpha": ("method", "alpha"),
    "dropout": ("method", "dropout"), "target_modules": ("method", "target_modules"),
    "epochs": ("hyperparameters", "epochs"), "max_steps": ("hyperparameters", "max_steps"),
    "learning_rate": ("hyperparameters", "learning_rate"),
    "global_batch_size": ("hyperparameters", "global_batch_size"),
    "micro_batch_size": ("hyperparameters", "micro_batch_size"),
    "max_seq_len": ("hyperparameters", "max_seq_len"), "seed": ("hyperparameters", "seed"),
    "min_workers": ("scaling", "min_workers"), "max_workers": ("scaling", "max_workers"),
    "use_gpu": ("scaling", "use_gpu"), "checkpoint_every": ("checkpoint", "every_steps"),
}


def _read_request_file(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path} as JSON: {exc}", exit_code=2) from exc
    if not isinstance(body, dict):
        raise CliError(f"{path} must hold a JSON object (a job request)", exit_code=2)
    return body


def build_request(file: Path | None, flags: dict[str, Any]) -> JobCreate:
    """Return the request from `file` with the set `flags` on top; raises ValidationError."""
    body = _read_request_file(file) if file else {}
    method = flags.get("method")
    if method and (body.get("method") or {}).get("type", "lora") != method.value:
        body.pop("method", None)  # another method: the file's method fields no longer apply
    if isinstance(flags.get("target_modules"), str) and flags["target_modules"] != "all-linear":
        flags["target_modules"] = [m.strip() for m in flags["target_modules"].split(",") if m]
    for flag, value in flags.items():
        section, field = CREATE_FIELDS[flag]
        if value is None:
            continue
        value = value.value if isinstance(value, Enum) else value
        if not section:
            body[field] = value
            continue
        body[section] = {**(body.get(section) or {}), field: value}
        if section == "method":
            body[section].setdefault("type", "lora")
    return JobCreate.model_validate(body)


def jobs_create(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Base model name or path.")] = None,
    training_file: Annotated[str | None, typer.Option(help="Training JSONL path.")] = None,
    validation_file: Annotated[str | None, typer.Option(help="Validation JSONL path.")] = None,
    method: Annotated[MethodName | None, typer.Option()] = None,
    r: Annotated[int | None, typer.Option("--r", help="LoRA rank.")] = None,
    alpha: Annotated[float | None, typer.Option(help="LoRA alpha.")] = None,
    dropout: Annotated[float | None, typer.Option(help="LoRA dropout.")] = None,
    target_modules: Annotated[str | None, typer.Option(help="Comma list or all-linear.")] = None,
    epochs: Annotated[float | None, typer.Option()] = None,
    max_steps: Annotated[int | None, typer.Option()] = None,
    learning_rate: Annotated[float | None, typer.Option()] = None,
    global_batch_size: Annotated[int | None, typer.Option()] = None,
    micro_batch_size: Annotated[int | None, typer.Option()] = None,
    max_seq_len: Annotated[int | None, typer.Option()] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    min_workers: Annotated[int | None, typer.Option()] = None,
    max_workers: Annotated[int | None, typer.Option()] = None,
    use_gpu: Annotated[bool | None, typer.Option("--use-gpu/--no-use-gpu")] = None,
    strategy: Annotated[StrategyName | None, typer.Option()] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Checkpoint every N steps.")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    priority: Annotated[str | None, typer.Option(help="low, normal, high or 0-100: order in your own queue.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", exists=True, dir_okay=False,
                                              help="JSON request; flags override it.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Then wait as `eft jobs wait`.")] = False,
    as_json: AsJson = False,
) -> None:
    """Submit a job: `eft jobs create --model tiny-llama --training-file data/train.jsonl`."""
    flags = {key: value for key, value in locals().items() if key in CREATE_FIELDS}
    if priority is not None and (number := decimal_int(priority)) is not None:
        flags["priority"] = number
    client = client_of(ctx)
    job = client.jobs.create(build_request(file, flags))
    if wait:
        return wait_and_report(client, job.id, 2.0, None, as_json)
    _show_job(job, as_json)


def jobs_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="Jobs per page.")] = 20,
    status: Annotated[JobStatus | None, typer.Option()] = None,
    after: Annotated[str | None, typer.Option(help="Cursor from the previous page.")] = None,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first: `eft jobs list --status running`."""
    page = client_of(ctx).jobs.list(limit=limit, after=after, status=status)
    if as_json:
        return emit_json(page.body)
    rows = [(j.id, j.name or "-", status_text(j), j.model, progress_text(j), time_text(j.created_at))
            for j in page.data]
    out.print(table("id", "name", "status", "model", "step", "created", rows=rows))
    if page.has_more:
        out.print(Text(f"more: eft jobs list --after {page.next_cursor}", style="dim"))


def jobs_get(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Show one job: `eft jobs get ftjob-...`."""
    _show_job(client_of(ctx).jobs.retrieve(job_id), as_json)


def jobs_cancel(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Ask a job to stop; it keeps its last checkpoint: `eft jobs cancel ftjob-...`."""
    _show_job(client_of(ctx).jobs.cancel(job_id), as_json)


def jobs_pause(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Pause a job: it checkpoints at once and releases its workers: `eft jobs pause ftjob-...`."""
    _show_job(client_of(ctx).jobs.pause(job_id), as_json)


def jobs_resume(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Resume a paused job from its pause checkpoint: `eft jobs resume ftjob-...`."""
    _show_job(client_of(ctx).jobs.resume(job_id), as_json)


def jobs_events(
    ctx: typer.Context,
    job_id: JobId,
    after: Annotated[int | None, typer.Option(help="Only events after this event id.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: AsJson = False,
) -> None:
    """Show a job's events, oldest first: `eft jobs events ftjob-...`."""
    events = client_of(ctx).jobs.list_events(job_id, after=after, limit=limit)
    if as_json:
        return emit_json(events)
    rows = [(e.id, time_text(e.created_at), e.level, e.type, e.message) for e in events.data]
    out.print(table("id", "time", "level", "type", "message", rows=rows))


def jobs_checkpoints(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Show the checkpoints a job saved, oldest first: `eft jobs checkpoints ftjob-...`."""
    checkpoints = client_of(ctx).jobs.checkpoints(job_id)
    if as_json:
        return emit_json(checkpoints)
    out.print(table("step", "attempt", "reason", "workers", "kept", "path", rows=[
        (c.step, c.attempt, c.reason or "-", c.world_size or "-", "yes" if c.available else "pruned", c.path)
        for c in checkpoints]))


# The one table of commands: "group name" -> function. Registration below reads only this;
# `eft jobs wait|watch|logs|plot`, `eft files`, `eft models` and `eft plan` live in modules of their own, the server's commands (`up`, `down`,
# `keys`) arrive through the `eft.commands` entry-point group (eft/_plugins.py).
COMMANDS: dict[str, Callable[..., None]] = {
    "jobs create": jobs_create, "jobs list": jobs_list, "jobs get": jobs_get,
    "jobs cancel": jobs_cancel, "jobs pause": jobs_pause, "jobs resume": jobs_resume, "jobs events": jobs_events, "jobs checkpoints": jobs_checkpoints,
}
