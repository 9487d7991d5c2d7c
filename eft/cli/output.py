"""What every `eft` command shares, and the one module commands and plugins (`eft.commands`
entry points) import from the CLI: the client a command talks to, its options, and how it
prints (tables, JSON, errors and their exit codes)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, get_args

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eft._errors import APIStatusError, EftError
from eft.client import Client
from eft.types.jobs import FullMethod, Job, JobStatus, LoraMethod, QloraMethod, Strategy

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


def client_of(ctx: typer.Context) -> Client:
    return make_client(**(ctx.find_root().obj or {}))





def emit_json(data: Any) -> None:
    payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    typer.echo(json.dumps(payload, indent=2, default=str))


def fail(message: str, problems: list[str], as_json: bool, exit_code: int, body: Any = None):
    if as_json:
        typer.echo(json.dumps(body or {"error": {"message": message, "errors": problems}}, indent=2,
                              default=str), err=True)
    else:
        err.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
        for problem in problems:
            err.print(Text(f"  - {problem}"), soft_wrap=True)
    raise typer.Exit(exit_code)


def guarded(command: Callable) -> Callable:
    """Turn client and validation errors into a message and an exit code (1 API, 2 usage)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        try:
            return command(*args, **kwargs)
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors()]
            fail("invalid job request", problems, as_json, 2)
        except APIStatusError as exc:
            problems = [f"{p.get('param') or 'request'}: {p.get('message')}" for p in exc.errors]
            if exc.request_id and not as_json:
                problems.append(f"request id: {exc.request_id}")
            body = exc.body if isinstance(exc.body, dict) else None
            exit_code = 2 if exc.status_code in REFUSED_STATUSES else 1
            fail(f"{exc.status_code} {exc.message}", problems, as_json, exit_code, body)
        except (EftError, CliError) as exc:
            fail(str(exc), [], as_json, getattr(exc, "exit_code", 1))

    return run


def table(*columns: str, rows: list[tuple[Any, ...]]) -> Table:
    """A borderless table; with no column names it is a key/value listing without a header."""
    table = Table(*columns, box=None, header_style="bold", show_header=any(columns))
    for row in rows:
        # Text() keeps user content (names, messages) from being read as rich markup.
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    return table


def status_text(job: Job) -> Text:
    return Text(job.status.value, style=STATUS_STYLE.get(job.status, ""))


def progress_text(job: Job) -> str:
    return f"{job.step}/{job.total_steps}" if job.total_steps else str(job.step)


def time_text(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"
