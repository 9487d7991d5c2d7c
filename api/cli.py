"""The server's commands of `eft`, registered through the `eft.commands` entry point:

    eft up --num-cpus 8                          # local Ray (if none) and the service
    eft down
    eft keys create --tenant team-a [--role admin] [--name ci]   # prints the key once
    eft keys list [--tenant team-a]
    eft keys revoke key_...
    eft tenants set team-a --max-active-jobs 4 --max-gpus 8 [--queue-over-quota]
    eft tenants get team-a

`eft keys` runs on a machine that reaches the service's database (EFT_DATABASE_URL, or the
SQLite file under EFT_HOME); it needs no running service. This module imports only what the
client has; Ray, FastAPI and the store load inside the commands.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
from rich.text import Text

from eft.cli.output import AsJson, CliError, emit_json, table, out

GROUPS = {"keys": "Create, list and revoke API keys (admin; needs the store).",
          "tenants": "Set and show a tenant's quotas (admin; needs the store)."}


def _service_local():
    try:
        # Ray and FastAPI load here only, for up/down (`import_module` looks in sys.modules first).
        local = importlib.import_module("eft.api.local")
    except ImportError as exc:
        raise CliError(f"`eft up`/`eft down` need the server: pip install 'eft[server]' ({exc})") from exc
    return local


def up(port: Annotated[int | None, typer.Option(help="Port of the REST API [default: EFT_PORT, else 8000].")] = None,
       num_cpus: Annotated[int | None, typer.Option(help="CPUs for a new local Ray.")] = None,
       as_json: AsJson = False) -> None:
    """Start local Ray (or join a running one) and the service: `eft up --num-cpus 8`."""
    local = _service_local()
    try:
        info = local.up(port=port, num_cpus=num_cpus)
    except local.PortTaken as exc:
        raise CliError(str(exc), exit_code=2) from None
    if as_json:
        return emit_json(info)
    ray = "started" if info["started_ray"] else "already running (reused)"
    rows = [("service", info["service_url"]), ("dashboard", info["dashboard_url"]), ("ray", ray)]
    if info.get("config"):
        rows.append(("api key", f"in {info['config']}"))
    out.print(table("", "", rows=rows))


def down(as_json: AsJson = False) -> None:
    """Stop the service, and Ray when `eft up` started it: `eft down`."""
    info = _service_local().down()
    if as_json:
        return emit_json(info)
    out.print(table("", "", rows=[
        ("service", "stopped" if info["stopped_service"] else "was not running"),
        ("ray", "stopped" if info["stopped_ray"] else "not started by eft up: left as is"),
    ]))


def _key_store() -> tuple[Any, Any]:
    try:
        from eft.service.accounts.auth import KeyStore
        from eft.service.settings import get_settings
        from eft.service.store.store import Store
    except ImportError as exc:
        raise CliError(f"`eft keys` needs the server: pip install 'eft[server]' ({exc})") from exc
    from eft.service import credentials
    credentials.load()  # the database URL may be in the secrets file EFT_SECRETS_FILE names
    store = Store(get_settings().resolved_database_url)
    return store, KeyStore(store.engine)


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
        return emit_json({**_key_row(record), "key": secret})
    out.print(table("", "", rows=[("id", record.id), ("tenant", record.tenant),
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
        return emit_json({"object": "list", "data": rows})
    out.print(table("id", "tenant", "role", "name", "prefix", "created", "revoked",
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
        return emit_json(_key_row(record))
    out.print(Text(f"revoked {record.id} ({record.tenant})"))


def _limits(tenant: str) -> tuple[Any, Any, Any]:
    """(store, quotas module, settings) for the tenant commands."""
    try:
        from eft.service.accounts import quotas
        from eft.service.settings import get_settings
        from eft.service.store.store import Store
    except ImportError as exc:
        raise CliError(f"`eft tenants` needs the server: pip install 'eft[server]' ({exc})") from exc
    from eft.service import credentials
    credentials.load()
    settings = get_settings()
    return Store(settings.resolved_database_url), quotas, settings


def _show_limits(tenant: str, limits: Any, as_json: bool) -> None:
    row = {"tenant": tenant, "max_active_jobs": limits.max_active_jobs, "max_cpus": limits.max_cpus,
           "max_gpus": limits.max_gpus, "queue_over_quota": limits.queue_over_quota}
    if as_json:
        return emit_json(row)
    out.print(table("", "", rows=list(row.items())))


def tenants_set(
    tenant: Annotated[str, typer.Argument(help="Tenant id, e.g. team-a.")],
    max_active_jobs: Annotated[int | None, typer.Option(min=0, help="Validating, queued and running jobs.")] = None,
    max_cpus: Annotated[float | None, typer.Option(min=0, help="CPUs its active jobs may ask for.")] = None,
    max_gpus: Annotated[float | None, typer.Option(min=0, help="GPUs its active jobs may ask for.")] = None,
    queue_over_quota: Annotated[bool, typer.Option(help="Accept jobs over the limits; they wait queued.")] = False,
    as_json: AsJson = False,
) -> None:
    """Replace a tenant's quotas (an option left out takes the server's default):
    `eft tenants set team-a --max-active-jobs 4 --max-gpus 8`."""
    store, quotas, settings = _limits(tenant)
    try:
        quotas.set_tenant_limits(store, tenant, max_active_jobs=max_active_jobs, max_cpus=max_cpus,
                                 max_gpus=max_gpus, queue_over_quota=queue_over_quota)
        _show_limits(tenant, quotas.limits_for(store, tenant, settings), as_json)
    finally:
        store.close()


def tenants_get(tenant: Annotated[str, typer.Argument(help="Tenant id, e.g. team-a.")],
                as_json: AsJson = False) -> None:
    """Show the quotas in force for a tenant, defaults filled in: `eft tenants get team-a`."""
    store, quotas, settings = _limits(tenant)
    try:
        _show_limits(tenant, quotas.limits_for(store, tenant, settings), as_json)
    finally:
        store.close()


COMMANDS = {"up": up, "down": down, "keys create": keys_create, "keys list": keys_list,
            "keys revoke": keys_revoke, "tenants set": tenants_set, "tenants get": tenants_get}
