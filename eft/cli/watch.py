"""Watching jobs: `eft jobs wait|watch` (a progress bar), `eft jobs logs` (`--follow` streams
them) and `eft jobs plot` (loss curves as a PNG).

    eft jobs wait ftjob-...              # exit 0 only when the job succeeded
    eft jobs logs ftjob-... --follow
    eft jobs plot ftjob-... -o loss.png
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from eft import monitor
from eft.cli.output import AsJson, CliError, JobId, client_of, emit_json, progress_text, status_text, out
from eft.client import Client
from eft.types.jobs import Job, JobMetric, JobStatus


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


def wait_and_report(client: Client, job_id: str, poll_interval_s: float,
                     timeout_s: float | None, as_json: bool) -> None:
    if as_json:
        job = client.jobs.wait(job_id, poll_interval_s, timeout_s)
        emit_json(job)
    else:
        job = _wait_with_progress(client, job_id, poll_interval_s, timeout_s)
        line = Text(f"{job.id} ") + status_text(job) + Text(f" at step {progress_text(job)}")
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
    wait_and_report(client_of(ctx), job_id, poll_interval_s, timeout_s, as_json)


def jobs_logs(
    ctx: typer.Context,
    job_id: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option(min=1, help="An earlier attempt's logs.")] = None,
    tail: Annotated[int | None, typer.Option(min=1, help="Only the last N lines.")] = None,
    as_json: AsJson = False,
) -> None:
    """Print a job's driver logs from Ray Jobs: `eft jobs logs ftjob-... --follow`."""
    client = client_of(ctx)
    if follow:
        for line in client.jobs.follow_logs(job_id, attempt=attempt):
            typer.echo(json.dumps({"line": line}) if as_json else line)
        return
    logs = client.jobs.logs(job_id, attempt=attempt, tail=tail)
    if as_json:
        return emit_json(logs)
    typer.echo(logs.data, nl=not logs.data.endswith("\n"))


def jobs_plot(
    ctx: typer.Context,
    job_id: JobId,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="PNG path; default <job id>-loss.png.")] = None,
    as_json: AsJson = False,
) -> None:
    """Write a PNG of a job's loss and eval-loss curves: `eft jobs plot ftjob-... -o loss.png`."""
    client = client_of(ctx)
    job = client.jobs.retrieve(job_id)
    try:
        path = monitor.plot_losses(job, client.jobs.metrics(job_id).data, output or Path(f"{job_id}-loss.png"))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if as_json:
        return emit_json({"job_id": job_id, "path": str(path)})
    out.print(Text(f"wrote {path}"))


COMMANDS = {"jobs wait": jobs_wait, "jobs watch": jobs_wait, "jobs logs": jobs_logs, "jobs plot": jobs_plot}
