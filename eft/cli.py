"""`eft`: the command line of the elastic fine-tuning service.

    eft up --num-cpus 8                  # start local Ray and the service, print the dashboard
    eft jobs create --model tiny-llama --training-file data/train.jsonl --max-steps 20 --wait
    eft jobs create --file request.json --learning-rate 1e-4   # flags override the file
    eft jobs list --status running
    eft jobs wait ftjob-...              # progress bar; exit 0 only when the job succeeded
    eft plan --model llama-2-70b --method lora --gpus 8 --gpu-memory 32 --seq-len 4096
    eft down

Every command takes --json to print machine-readable JSON only (errors go to stderr, as JSON
too). --base-url and --api-key (or EFT_BASE_URL and EFT_API_KEY) choose the service. Exit codes:
0 ok; 1 the job did not succeed, or the service answered with an error (not found, conflict,
quota, server error, unreachable); 2 a refused request (a bad flag, or a request the client or the
service found invalid: 400, 413, 422). Shell completion: `eft --install-completion`.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eft.types.jobs import (
    FullMethod,
    Job,
    JobCreate,
    JobStatus,
    LoraMethod,
    QloraMethod,
    Strategy,
    tuning_of,
)
from eft._errors import APIStatusError, EftError
from eft.client import Client, __version__
from eft.types.text import decimal_int

app = typer.Typer(help="Elastic fine-tuning on Ray.", no_args_is_help=True)
jobs_app = typer.Typer(help="Create, inspect, pause, resume, cancel and wait for fine-tuning jobs.",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
# Piped into another program, lines are never wrapped or cut: ids and paths stay whole.
out = Console(width=None if sys.stdout.isatty() else 4096)
err = Console(stderr=True)
#: Statuses of a request the service refused as invalid: the usage exit code, like a bad flag.
REFUSED_STATUSES = frozenset({400, 413, 422})

AsJson = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON only.")]
JobId = Annotated[str, typer.Argument(help="Job id, e.g. ftjob-...")]
# Choices come from the wire models, so a new method or strategy needs no CLI change.
MethodName = Enum("MethodName", {m.model_fields["type"].default: m.model_fields["type"].default
                                 for m in (LoraMethod, QloraMethod, FullMethod)}, type=str)
StrategyName = Enum("StrategyName", {s: s for s in get_args(Strategy)}, type=str)
STATUS_STYLE = {JobStatus.succeeded: "green", JobStatus.failed: "red",
                JobStatus.cancelled: "yellow", JobStatus.running: "cyan", JobStatus.paused: "magenta"}


class CliError(Exception):
    """A failure the CLI reports as one message and an exit code."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def make_client(base_url: str | None, api_key: str | None) -> Client:
    """Return the client every command uses (tests replace this seam with a mocked one)."""
    return Client(base_url=base_url, api_key=api_key)


def _client(ctx: typer.Context) -> Client:
    return make_client(**(ctx.find_root().obj or {}))


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"eft {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    base_url: Annotated[str | None, typer.Option(envvar="EFT_BASE_URL",
                                                 help="Service URL.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="EFT_API_KEY", show_default=False,
                                                help="API key (sent as a Bearer token).")] = None,
    _version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                           help="Print the version and exit.")] = False,
) -> None:
    """Elastic fine-tuning on Ray: start the service with `eft up`, then `eft jobs create`."""
    ctx.obj = {"base_url": base_url, "api_key": api_key}


# --- output --------------------------------------------------------------------------------


def _emit_json(data: Any) -> None:
    payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    typer.echo(json.dumps(payload, indent=2, default=str))


def _fail(message: str, problems: list[str], as_json: bool, exit_code: int, body: Any = None):
    if as_json:
        typer.echo(json.dumps(body or {"error": {"message": message, "errors": problems}}, indent=2,
                              default=str), err=True)
    else:
        err.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
        for problem in problems:
            err.print(Text(f"  - {problem}"), soft_wrap=True)
    raise typer.Exit(exit_code)


def _guarded(command: Callable) -> Callable:
    """Turn client and validation errors into a message and an exit code (1 API, 2 usage)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        try:
            return command(*args, **kwargs)
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors()]
            _fail("invalid job request", problems, as_json, 2)
        except APIStatusError as exc:
            problems = [f"{p.get('param') or 'request'}: {p.get('message')}" for p in exc.errors]
            if exc.request_id and not as_json:
                problems.append(f"request id: {exc.request_id}")
            body = exc.body if isinstance(exc.body, dict) else None
            exit_code = 2 if exc.status_code in REFUSED_STATUSES else 1
            _fail(f"{exc.status_code} {exc.message}", problems, as_json, exit_code, body)
        except (EftError, CliError) as exc:
            _fail(str(exc), [], as_json, getattr(exc, "exit_code", 1))

    return run


def _table(*columns: str, rows: list[tuple[Any, ...]]) -> Table:
    """A borderless table; with no column names it is a key/value listing without a header."""
    table = Table(*columns, box=None, header_style="bold", show_header=any(columns))
    for row in rows:
        # Text() keeps user content (names, messages) from being read as rich markup.
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    return table


def _status(job: Job) -> Text:
    return Text(job.status.value, style=STATUS_STYLE.get(job.status, ""))


def _progress(job: Job) -> str:
    return f"{job.step}/{job.total_steps}" if job.total_steps else str(job.step)


def _time(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _show_job(job: Job, as_json: bool) -> None:
    if as_json:
        return _emit_json(job)
    tuning = tuning_of(job.method)
    method = tuning.type + (f" r={tuning.r}" if isinstance(tuning, LoraMethod) else "")
    if tuning is not job.method:
        method = f"{job.method.type} (beta={job.method.beta}) with {method}"
    scaling = job.scaling
    rows = [
        ("id", job.id), ("name", job.name or "-"), ("status", _status(job)), ("model", job.model),
        ("training file", job.training_file), ("method", method), ("strategy", job.strategy),
        ("workers", f"{job.num_workers or '-'} (of {scaling.min_workers}"
                    f"..{scaling.resolved_max_workers})"),
        ("progress", _progress(job)), ("created", _time(job.created_at)),
        ("finished", _time(job.finished_at)), ("artifact", job.artifact_path or "-"),
    ]
    if job.queue:
        start = f", start ~{_time(job.queue.estimated_start)}" if job.queue.estimated_start else ""
        rows.append(("queue", f"#{job.queue.position}: {job.queue.reason}{start}"))
    if job.error:
        rows.append(("error", f"{job.error.code}: {job.error.message}"))
    out.print(_table("", "", rows=rows))


# --- commands ------------------------------------------------------------------------------


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
    client = _client(ctx)
    job = client.jobs.create(build_request(file, flags))
    if wait:
        from eft.cli_watch import wait_and_report

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
    page = _client(ctx).jobs.list(limit=limit, after=after, status=status)
    if as_json:
        return _emit_json(page.body)
    rows = [(j.id, j.name or "-", _status(j), j.model, _progress(j), _time(j.created_at))
            for j in page.data]
    out.print(_table("id", "name", "status", "model", "step", "created", rows=rows))
    if page.has_more:
        out.print(Text(f"more: eft jobs list --after {page.next_cursor}", style="dim"))


def jobs_get(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Show one job: `eft jobs get ftjob-...`."""
    _show_job(_client(ctx).jobs.retrieve(job_id), as_json)


def jobs_cancel(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Ask a job to stop; it keeps its last checkpoint: `eft jobs cancel ftjob-...`."""
    _show_job(_client(ctx).jobs.cancel(job_id), as_json)


def jobs_pause(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Pause a job: it checkpoints at once and releases its workers: `eft jobs pause ftjob-...`."""
    _show_job(_client(ctx).jobs.pause(job_id), as_json)


def jobs_resume(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Resume a paused job from its pause checkpoint: `eft jobs resume ftjob-...`."""
    _show_job(_client(ctx).jobs.resume(job_id), as_json)


def jobs_events(
    ctx: typer.Context,
    job_id: JobId,
    after: Annotated[int | None, typer.Option(help="Only events after this event id.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: AsJson = False,
) -> None:
    """Show a job's events, oldest first: `eft jobs events ftjob-...`."""
    events = _client(ctx).jobs.list_events(job_id, after=after, limit=limit)
    if as_json:
        return _emit_json(events)
    rows = [(e.id, _time(e.created_at), e.level, e.type, e.message) for e in events.data]
    out.print(_table("id", "time", "level", "type", "message", rows=rows))


def jobs_checkpoints(ctx: typer.Context, job_id: JobId, as_json: AsJson = False) -> None:
    """Show the checkpoints a job saved, oldest first: `eft jobs checkpoints ftjob-...`."""
    checkpoints = _client(ctx).jobs.checkpoints(job_id)
    if as_json:
        return _emit_json(checkpoints)
    out.print(_table("step", "attempt", "reason", "workers", "kept", "path", rows=[
        (c.step, c.attempt, c.reason or "-", c.world_size or "-", "yes" if c.available else "pruned", c.path)
        for c in checkpoints]))


# The one table of commands: "group name" -> function. Registration below reads only this;
# `eft jobs wait|watch|logs|plot`, `eft files`, `eft models` and `eft plan` live in modules of their own, the server's commands (`up`, `down`,
# `keys`) arrive through the `eft.commands` entry-point group (eft/_plugins.py).
COMMANDS: dict[str, Callable[..., None]] = {
    "jobs create": jobs_create, "jobs list": jobs_list, "jobs get": jobs_get,
    "jobs cancel": jobs_cancel, "jobs pause": jobs_pause, "jobs resume": jobs_resume, "jobs events": jobs_events, "jobs checkpoints": jobs_checkpoints,
}
GROUPS: dict[str, typer.Typer] = {"": app, "jobs": jobs_app}
from eft import _plugins, cli_files, cli_models, cli_plan, cli_watch  # noqa: E402

for _module in (cli_watch, cli_files, cli_models, cli_plan, *_plugins.command_modules()):
    COMMANDS.update(_module.COMMANDS)
    for _group_name, _help in getattr(_module, "GROUPS", {}).items():
        GROUPS[_group_name] = typer.Typer(help=_help, no_args_is_help=True)
        app.add_typer(GROUPS[_group_name], name=_group_name)
for _name, _command in COMMANDS.items():
    _group, _, _leaf = _name.rpartition(" ")
    GROUPS[_group].command(_leaf)(_guarded(_command))
