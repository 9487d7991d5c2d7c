"""`eft keys` (admin: API keys, straight against the job store) and `eft files` (uploads).

    eft keys create --tenant team-a [--role admin] [--name ci]   # prints the key once
    eft keys list [--tenant team-a]
    eft keys revoke key_...
    eft files upload data/train.jsonl
    eft files list
    eft files validate file-... --model tiny-llama --max-seq-len 512

`eft keys` runs on a machine that reaches the service's database (EFT_DATABASE_URL, or the
SQLite file under EFT_HOME) with the server installed; it needs no running service.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from eft.cli import AsJson, CliError, _client, _emit_json, _table, _time, out

keys_app = typer.Typer(help="Create, list and revoke API keys (admin; needs the store).",
                       no_args_is_help=True)
files_app = typer.Typer(help="Upload, list and validate training files.", no_args_is_help=True)


def _key_store() -> tuple[Any, Any]:
    try:
        settings = importlib.import_module("service.settings").get_settings()
        store = importlib.import_module("service.store").Store(settings.resolved_database_url)
        auth = importlib.import_module("service.auth")
    except ImportError as exc:
        raise CliError(f"`eft keys` needs the server installed (pip install eft): {exc}") from exc
    return store, auth.KeyStore(store.engine)


def _key_row(key: Any) -> dict[str, Any]:
    return {"id": key.id, "tenant": key.tenant, "role": key.role, "name": key.name,
            "prefix": key.prefix, "created_at": key.created_at.isoformat(),
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None}


def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key belongs to.")] = "default",
    role: Annotated[str, typer.Option(help="user (its tenant only) or admin (every tenant).")] = "user",
    name: Annotated[str | None, typer.Option(help="A label, e.g. who holds the key.")] = None,
    as_json: AsJson = False,
) -> None:
    """Create an API key and print it (shown once): `eft keys create --tenant team-a`."""
    store, keys = _key_store()
    try:
        record, secret = keys.create(tenant, role, name)
    except Exception as exc:
        if type(exc).__name__ == "ServiceError":
            raise CliError(str(exc), exit_code=2) from None
        raise
    finally:
        store.close()
    if as_json:
        return _emit_json({**_key_row(record), "key": secret})
    out.print(_table("", "", rows=[("id", record.id), ("tenant", record.tenant),
                                   ("role", record.role), ("key", secret)]))
    out.print(Text("store the key now: it is not shown again", style="dim"))


def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked keys.")] = False,
    as_json: AsJson = False,
) -> None:
    """List API keys (never the keys themselves): `eft keys list`."""
    store, keys = _key_store()
    try:
        rows = [_key_row(k) for k in keys.list(tenant, include_revoked=revoked)]
    finally:
        store.close()
    if as_json:
        return _emit_json({"object": "list", "data": rows})
    out.print(_table("id", "tenant", "role", "name", "prefix", "created", "revoked",
                     rows=[(r["id"], r["tenant"], r["role"], r["name"] or "-", r["prefix"] + "…",
                            r["created_at"][:19], r["revoked_at"] or "-") for r in rows]))


def keys_revoke(key_id: Annotated[str, typer.Argument(help="Key id, e.g. key_...")],
                as_json: AsJson = False) -> None:
    """Revoke an API key at once: `eft keys revoke key_...`."""
    store, keys = _key_store()
    try:
        record = keys.revoke(key_id)
    except Exception as exc:
        if type(exc).__name__ == "KeyNotFound":
            raise CliError(str(exc)) from None
        raise
    finally:
        store.close()
    if as_json:
        return _emit_json(_key_row(record))
    out.print(Text(f"revoked {record.id} ({record.tenant})"))


def files_upload(ctx: typer.Context,
                 path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A JSONL file.")],
                 as_json: AsJson = False) -> None:
    """Upload a training file; prints its id: `eft files upload data/train.jsonl`."""
    f = _client(ctx).files.create(path)
    if as_json:
        return _emit_json(f)
    out.print(_table("", "", rows=[("id", f.id), ("file", f.filename), ("bytes", f.bytes),
                                   ("sha256", f.sha256)]))


def files_list(ctx: typer.Context,
               limit: Annotated[int, typer.Option(min=1, help="Files per page.")] = 20,
               after: Annotated[str | None, typer.Option(help="Cursor from the previous page.")] = None,
               as_json: AsJson = False) -> None:
    """List uploaded files, newest first: `eft files list`."""
    page = _client(ctx).files.list(limit=limit, after=after)
    if as_json:
        return _emit_json(page)
    out.print(_table("id", "file", "bytes", "created", rows=[
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
    report = _client(ctx).files.validate(file_id, **{k: v for k, v in options.items() if v is not None})
    if as_json:
        _emit_json(report)
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


COMMANDS = {"keys create": keys_create, "keys list": keys_list, "keys revoke": keys_revoke,
            "files upload": files_upload, "files list": files_list, "files validate": files_validate}
GROUPS = {"keys": keys_app, "files": files_app}
