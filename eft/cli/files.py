"""`eft files`: upload, list, validate, download and delete training files.

    eft files upload data/train.jsonl
    eft files list
    eft files validate file-... --model tiny-llama --max-seq-len 512
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from eft.cli.output import AsJson, client_of, emit_json, table, out

GROUPS = {"files": "Upload, list and validate training files."}


def files_upload(ctx: typer.Context,
                 path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A JSONL file.")],
                 as_json: AsJson = False) -> None:
    """Upload a training file; prints its id: `eft files upload data/train.jsonl`."""
    f = client_of(ctx).files.create(path)
    if as_json:
        return emit_json(f)
    out.print(table("", "", rows=[("id", f.id), ("file", f.filename), ("bytes", f.bytes),
                                   ("sha256", f.sha256)]))


def files_list(ctx: typer.Context,
               limit: Annotated[int, typer.Option(min=1, help="Files per page.")] = 20,
               after: Annotated[str | None, typer.Option(help="Cursor from the previous page.")] = None,
               as_json: AsJson = False) -> None:
    """List uploaded files, newest first: `eft files list`."""
    page = client_of(ctx).files.list(limit=limit, after=after)
    if as_json:
        return emit_json(page)
    out.print(table("id", "file", "bytes", "created", rows=[
        (f.id, f.filename, f.bytes, f.created_at) for f in page.data]))
    if page.has_more:
        out.print(Text(f"more: eft files list --after {page.next_cursor}", style="dim"))


def files_validate(ctx: typer.Context,
                   file_id: Annotated[str, typer.Argument(help="File id, e.g. file-...")],
                   model: Annotated[str | None, typer.Option(help="Count tokens with this model.")] = None,
                   max_seq_len: Annotated[int, typer.Option(min=8)] = 512,
                   validation_file: Annotated[str | None, typer.Option(help="File id to check overlap with.")] = None,
                   as_json: AsJson = False) -> None:
    """Check every line of a file without a job; exit 1 when it cannot train."""
    options = {"max_seq_len": max_seq_len, "model": model, "validation_file": validation_file}
    report = client_of(ctx).files.validate(file_id, **{k: v for k, v in options.items() if v is not None})
    if as_json:
        emit_json(report)
    else:
        out.print(Text(f"{report.file}: {report.records} records {report.formats}; "
                       f"{report.errors_total} error(s), {len(report.warnings)} warning(s)"))
        for p in [*report.errors, *report.warnings]:
            out.print(Text(f"  line {p.line}: {p.field}: {p.message} ({p.code})"), soft_wrap=True)
        if report.tokens:
            t = report.tokens
            out.print(Text(f"tokens: min {t.min} max {t.max} mean {t.mean}; {t.truncated} cut at "
                           f"{report.max_seq_len}; {t.loss_tokens} carry loss"))
        if report.example:
            out.print(Text("loss on: ") + Text("".join(x.token for x in report.example if x.loss),
                                               style="bold green"))
    if not report.ok:
        raise typer.Exit(1)


def files_delete(ctx: typer.Context,
                 file_id: Annotated[str, typer.Argument(help="File id, e.g. file-...")],
                 as_json: AsJson = False) -> None:
    """Delete an uploaded file: `eft files delete file-...`."""
    deleted = client_of(ctx).files.delete(file_id)
    if as_json:
        return emit_json(deleted)
    out.print(Text(f"deleted {deleted.id}"))


def files_download(ctx: typer.Context,
                   file_id: Annotated[str, typer.Argument(help="File id, e.g. file-...")],
                   output: Annotated[Path | None, typer.Option("--output", "-o", dir_okay=False,
                                                               help="Where to write it; - for stdout.")] = None,
                   as_json: AsJson = False) -> None:
    """Download an uploaded file: `eft files download file-... -o train.jsonl` (default: its
    original name in the current directory)."""
    client = client_of(ctx)
    content = client.files.content(file_id)
    if output is not None and str(output) == "-":
        sys.stdout.buffer.write(content)
        return None
    path = output or Path(client.files.retrieve(file_id).filename).name
    Path(path).write_bytes(content)
    if as_json:
        return emit_json({"id": file_id, "path": str(path), "bytes": len(content)})
    out.print(Text(f"wrote {path} ({len(content)} bytes)"))


COMMANDS = {"files upload": files_upload, "files list": files_list, "files validate": files_validate,
            "files delete": files_delete, "files download": files_download}
