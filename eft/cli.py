"""`eft`: the command line of the elastic fine-tuning service.

    eft up --num-cpus 8                  # start local Ray and the service, print the dashboard
    eft jobs create --model tiny-llama --training-file data/train.jsonl --max-steps 20 --wait
    eft jobs create --file request.json --learning-rate 1e-4   # flags override the file
    eft jobs list --status running
    eft jobs wait ftjob-...              # progress bar; exit 0 only when the job succeeded
    eft plan --model llama-2-70b --method lora --gpus 8 --gpu-memory 32 --seq-len 4096
    eft down

Every command takes --json to print machine-readable JSON only. --base-url and --api-key (or
EFT_BASE_URL and EFT_API_KEY) choose the service. Exit codes: 0 ok, 1 API error or job not
succeeded, 2 usage error (bad flag, invalid request).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from api.models import (
    FullMethod,
    Job,
    JobCreate,
    JobMetric,
    JobStatus,
    LoraMethod,
    Plan,
    PlanCandidate,
    PlanRequest,
    QloraMethod,
    Strategy,
)
from eft._errors import APIStatusError, EftError
from eft import monitor
from eft.client import Client

app = typer.Typer(help="Elastic fine-tuning on Ray.", no_args_is_help=True, add_completion=False)
jobs_app = typer.Typer(help="Create, inspect, cancel and wait for fine-tuning jobs.",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
out = Console()
err = Console(stderr=True)

AsJson = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON only.")]
JobId = Annotated[str, typer.Argument(help="Job id, e.g. ftjob-...")]
# Choices come from the wire models, so a new method or strategy needs no CLI change.
MethodName = Enum("MethodName", {m.model_fields["type"].default: m.model_fields["type"].default
                                 for m in (LoraMethod, QloraMethod, FullMethod)}, type=str)
StrategyName = Enum("StrategyName", {s: s for s in get_args(Strategy)}, type=str)
STATUS_STYLE = {JobStatus.succeeded: "green", JobStatus.failed: "red",
                JobStatus.cancelled: "yellow", JobStatus.running: "cyan"}


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


@app.callback()
def main(
    ctx: typer.Context,
    base_url: Annotated[str | None, typer.Option(envvar="EFT_BASE_URL",
                                                 help="Service URL.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="EFT_API_KEY", show_default=False,
                                                help="API key (sent as a Bearer token).")] = None,
) -> None:
    """Elastic fine-tuning on Ray: start the service with `eft up`, then `eft jobs create`."""
    ctx.obj = {"base_url": base_url, "api_key": api_key}


# --- output --------------------------------------------------------------------------------


def _emit_json(data: Any) -> None:
    payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    typer.echo(json.dumps(payload, indent=2, default=str))


def _fail(message: str, problems: list[str], as_json: bool, exit_code: int, body: Any = None):
    if as_json:
        _emit_json(body or {"error": {"message": message, "errors": problems}})
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
            _fail(f"{exc.status_code} {exc.message}", problems, as_json, 1, body)
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
    method = job.method.type + (f" r={job.method.r}" if isinstance(job.method, LoraMethod) else "")
    scaling = job.scaling
    rows = [
        ("id", job.id), ("name", job.name or "-"), ("status", _status(job)), ("model", job.model),
        ("training file", job.training_file), ("method", method), ("strategy", job.strategy),
        ("workers", f"{job.num_workers or '-'} (of {scaling.min_workers}"
                    f"..{scaling.resolved_max_workers})"),
        ("progress", _progress(job)), ("created", _time(job.created_at)),
        ("finished", _time(job.finished_at)), ("artifact", job.artifact_path or "-"),
    ]
    if job.error:
        rows.append(("error", f"{job.error.code}: {job.error.message}"))
    out.print(_table("", "", rows=rows))


# --- commands ------------------------------------------------------------------------------


def _service_local():
    try:
        local = importlib.import_module("service.local")  # ray and fastapi: only for up/down
    except ImportError as exc:
        raise CliError(f"`eft up`/`eft down` need the service installed with its server "
                       f"dependencies (pip install eft on the server machine): {exc}") from exc
    return local


def up(port: Annotated[int, typer.Option(help="Port of the REST API.")] = 8000,
       num_cpus: Annotated[int | None, typer.Option(help="CPUs for a new local Ray.")] = None,
       as_json: AsJson = False) -> None:
    """Start local Ray (or join a running one) and the service: `eft up --num-cpus 8`."""
    info = _service_local().up(port=port, num_cpus=num_cpus)
    if as_json:
        return _emit_json(info)
    ray = "started" if info["started_ray"] else "already running (reused)"
    rows = [("service", info["service_url"]), ("dashboard", info["dashboard_url"]), ("ray", ray)]
    if info.get("config"):
        rows.append(("api key", f"in {info['config']}"))
    out.print(_table("", "", rows=rows))


def down(as_json: AsJson = False) -> None:
    """Stop the service, and Ray when `eft up` started it: `eft down`."""
    info = _service_local().down()
    if as_json:
        return _emit_json(info)
    out.print(_table("", "", rows=[
        ("service", "stopped" if info["stopped_service"] else "was not running"),
        ("ray", "stopped" if info["stopped_ray"] else "not started by eft up: left as is"),
    ]))


# Flag of `jobs create` -> (section of JobCreate, field); "" is the top level.
CREATE_FIELDS = {
    "model": ("", "model"), "training_file": ("", "training_file"),
    "validation_file": ("", "validation_file"), "strategy": ("", "strategy"), "name": ("", "name"),
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
    file: Annotated[Path | None, typer.Option("--file", "-f", exists=True, dir_okay=False,
                                              help="JSON request; flags override it.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Then wait as `eft jobs wait`.")] = False,
    as_json: AsJson = False,
) -> None:
    """Submit a job: `eft jobs create --model tiny-llama --training-file data/train.jsonl`."""
    flags = {key: value for key, value in locals().items() if key in CREATE_FIELDS}
    client = _client(ctx)
    job = client.jobs.create(build_request(file, flags))
    if wait:
        return _wait_and_report(client, job.id, 2.0, None, as_json)
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


def _wait_with_progress(client: Client, job_id: str, poll_interval_s: float,
                        timeout_s: float | None) -> Job:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*columns, console=out) as bar:
        task = bar.add_task(job_id, total=None, info="")

        def show(job: Job, metric: JobMetric | None) -> None:
            bar.update(task, completed=job.step, total=job.total_steps, info=monitor.progress_text(job, metric),
                       description=f"{job.id} {job.status.value}")

        return client.jobs.wait(job_id, poll_interval_s, timeout_s, on_progress=show)


def _wait_and_report(client: Client, job_id: str, poll_interval_s: float,
                     timeout_s: float | None, as_json: bool) -> None:
    if as_json:
        job = client.jobs.wait(job_id, poll_interval_s, timeout_s)
        _emit_json(job)
    else:
        job = _wait_with_progress(client, job_id, poll_interval_s, timeout_s)
        line = Text(f"{job.id} ") + _status(job) + Text(f" at step {_progress(job)}")
        if job.error:
            line += Text(f": {job.error.code}: {job.error.message}")
        elif job.artifact_path:
            line += Text(f"; artifact: {job.artifact_path}")
        out.print(line)
    if job.status is not JobStatus.succeeded:
        raise typer.Exit(1)


def jobs_wait(
    ctx: typer.Context,
    job_id: JobId,
    poll_interval_s: Annotated[float, typer.Option("--poll-interval", min=0.0)] = 2.0,
    timeout_s: Annotated[float | None, typer.Option("--timeout", help="Give up after s.")] = None,
    as_json: AsJson = False,
) -> None:
    """Follow a job to its end with a progress bar (step, loss, tokens/s, ETA); exit 0 only if it
    succeeded. `eft jobs watch` is the same command."""
    _wait_and_report(_client(ctx), job_id, poll_interval_s, timeout_s, as_json)


def jobs_logs(
    ctx: typer.Context,
    job_id: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option(min=1, help="An earlier attempt's logs.")] = None,
    tail: Annotated[int | None, typer.Option(min=1, help="Only the last N lines.")] = None,
    as_json: AsJson = False,
) -> None:
    """Print a job's driver logs from Ray Jobs: `eft jobs logs ftjob-... --follow`."""
    client = _client(ctx)
    if follow:
        for line in client.jobs.follow_logs(job_id, attempt=attempt):
            typer.echo(json.dumps({"line": line}) if as_json else line)
        return
    logs = client.jobs.logs(job_id, attempt=attempt, tail=tail)
    if as_json:
        return _emit_json(logs)
    typer.echo(logs.data, nl=not logs.data.endswith("\n"))


def jobs_plot(
    ctx: typer.Context,
    job_id: JobId,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="PNG path; default <job id>-loss.png.")] = None,
    as_json: AsJson = False,
) -> None:
    """Write a PNG of a job's loss and eval-loss curves: `eft jobs plot ftjob-... -o loss.png`."""
    client = _client(ctx)
    job = client.jobs.retrieve(job_id)
    try:
        path = monitor.plot_losses(job, client.jobs.metrics(job_id).data, output or Path(f"{job_id}-loss.png"))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if as_json:
        return _emit_json({"job_id": job_id, "path": str(path)})
    out.print(Text(f"wrote {path}"))


# --- eft plan ------------------------------------------------------------------------------


def _local_architecture(planner: Any, model: str) -> Any:
    """A known name, a model directory or config.json path, or a model under an allowed root."""
    known = planner.known_architecture(model)
    if known is not None:
        return known
    candidates = [Path(model).expanduser()]
    if not candidates[0].exists():
        settings = importlib.import_module("service.settings").get_settings()
        candidates = [root / model for root in settings.allowed_model_roots]
    for path in candidates:
        if path.is_file() or (path / "config.json").is_file():
            return planner.architecture_from_config(path, name=model)
    raise CliError(f"unknown model {model!r}: name a known architecture "
                   f"({', '.join(planner.KNOWN_ARCHITECTURES)}), a directory holding a config.json, "
                   "or a config.json file", exit_code=2)


def plan_locally(request: PlanRequest) -> Plan:
    """Run the planner in this process (pure Python: no server, no torch) and return its Plan."""
    planner = importlib.import_module("service.planner")
    try:
        architecture = _local_architecture(planner, request.model)
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
    for name in ("params", "grads", "optim", "activ", "overhead", "total", "fits", "time"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("reason")
    for c in result.candidates:
        chosen = c == result.chosen
        m = c.memory_gb
        cells = [("▶ " if chosen else "  ") + _config_label(c),
                 *(f"{v:.2f}" for v in (m.parameters, m.gradients, m.optimizer, m.activations,
                                        m.overhead, m.total)),
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
    result = _client(ctx).plan(request) if remote else plan_locally(request)
    if as_json:
        _emit_json(result)
    else:
        _show_plan(result, request)
    if result.chosen is None:
        raise typer.Exit(1)


# The one table of commands: "group name" -> function. Registration below reads only this.
COMMANDS: dict[str, Callable[..., None]] = {
    "up": up, "down": down,
    "jobs create": jobs_create, "jobs list": jobs_list, "jobs get": jobs_get,
    "jobs cancel": jobs_cancel, "jobs events": jobs_events, "jobs wait": jobs_wait,
    "jobs watch": jobs_wait, "jobs logs": jobs_logs, "jobs plot": jobs_plot,
    "plan": plan,
}
_GROUPS = {"": app, "jobs": jobs_app}
# `eft keys` and `eft files` live in their own module, which uses the helpers above.
from eft import cli_accounts  # noqa: E402

COMMANDS.update(cli_accounts.COMMANDS)
for _group_name, _group_app in cli_accounts.GROUPS.items():
    app.add_typer(_group_app, name=_group_name)
    _GROUPS[_group_name] = _group_app
for _name, _command in COMMANDS.items():
    _group, _, _leaf = _name.rpartition(" ")
    _GROUPS[_group].command(_leaf)(_guarded(_command))
