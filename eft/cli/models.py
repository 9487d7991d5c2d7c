"""`eft models`: the base models the server fine-tunes and the models your jobs trained, and
`eft jobs download`: a job's files onto local disk.

    eft models list
    eft models get ft:tiny-llama:support-bot:ftjob-...
    eft jobs download ftjob-... -o ./adapter [--checkpoint 40]
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from eft.cli.output import AsJson, JobId, client_of, emit_json, table, out

GROUPS = {"models": "List base and fine-tuned models."}


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M")


def models_list(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List base models, then your fine-tuned models (newest first): `eft models list`."""
    page = client_of(ctx).models.list()
    if as_json:
        return emit_json(page)
    out.print(table("id", "owned by", "engine", "created",
                    rows=[(m.id, m.owned_by, m.engine or "", _when(m.created)) for m in page.data]))


def models_get(ctx: typer.Context,
               model: Annotated[str, typer.Argument(help="A base model's name, or an ft: id (of a checkpoint too).")],
               as_json: AsJson = False) -> None:
    """Show one model: `eft models get ft:tiny-llama:bot:ftjob-...`."""
    m = client_of(ctx).models.retrieve(model)
    if as_json:
        return emit_json(m)
    out.print(table("", "", rows=[("id", m.id), ("owned by", m.owned_by), ("engine", m.engine or "its base model's"),
                                  ("created", _when(m.created))]))


COMMANDS = {"models list": models_list, "models get": models_get}


def jobs_download(ctx: typer.Context, job_id: JobId,
                  output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write the files under.")],
                  checkpoint: Annotated[int | None, typer.Option(min=0, help="A kept checkpoint's step instead of "
                                                                 "the published artifact.")] = None,
                  merged: Annotated[bool, typer.Option("--merged", help="The merged model (base + adapter), "
                                                       "exported first if it is not yet.")] = False,
                  as_json: AsJson = False) -> None:
    """Download a job's artifact (or a checkpoint, or the merged model), each file checked
    against its SHA-256: `eft jobs download ftjob-... -o ./adapter [--checkpoint 40 | --merged]`."""
    client = client_of(ctx)
    if merged:
        export = client.jobs.wait_export(job_id)
        if export.status != "succeeded":
            raise typer.BadParameter(f"the merged export failed: {export.error}", param_hint="--merged")
    paths = client.jobs.download(job_id, output, checkpoint=checkpoint, merged=merged)
    if as_json:
        return emit_json({"job_id": job_id, "checkpoint": checkpoint, "merged": merged,
                           "files": [str(p) for p in paths]})
    out.print(table("file", "bytes", rows=[(str(p), p.stat().st_size) for p in paths]))


def jobs_export(ctx: typer.Context, job_id: JobId,
                wait: Annotated[bool, typer.Option("--wait", help="Wait until it is written.")] = False,
                adapter: Annotated[bool, typer.Option("--adapter", help="The adapter as it is, not merged "
                                                      "(with --hub-repo).")] = False,
                hub_repo: Annotated[str | None, typer.Option(help="Also push it to this Hugging Face Hub "
                                                             "repository (org/name).")] = None,
                as_json: AsJson = False) -> None:
    """Export a succeeded job's model merged into its base (safetensors, the base's dtype), or
    push it to the Hub: `eft jobs export ftjob-... --wait [--hub-repo org/name [--adapter]]`,
    then `eft jobs download ftjob-... --merged -o DIR`."""
    client = client_of(ctx)
    kind = "adapter" if adapter else "merged"
    export = (client.jobs.wait_export(job_id, kind, hub_repo=hub_repo) if wait
              else client.jobs.export(job_id, kind, hub_repo))
    if as_json:
        return emit_json(export)
    out.print(table("", "", rows=[("export", export.id), ("status", export.status), ("path", export.path),
                                   ("hub", export.hub_url or export.hub_repo or ""), ("error", export.error or "")]))


COMMANDS["jobs download"] = jobs_download
COMMANDS["jobs export"] = jobs_export
