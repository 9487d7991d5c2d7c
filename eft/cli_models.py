"""`eft models`: the base models the server fine-tunes and the models your jobs trained.

    eft models list
    eft models get ft:tiny-llama:support-bot:ftjob-...
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

import typer

from eft.cli import AsJson, _client, _emit_json, _table, out

GROUPS = {"models": "List base and fine-tuned models."}


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M")


def models_list(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List base models, then your fine-tuned models (newest first): `eft models list`."""
    page = _client(ctx).models.list()
    if as_json:
        return _emit_json(page)
    out.print(_table("id", "owned by", "created", rows=[(m.id, m.owned_by, _when(m.created)) for m in page.data]))


def models_get(ctx: typer.Context,
               model: Annotated[str, typer.Argument(help="A base model's name, or an ft: id (of a checkpoint too).")],
               as_json: AsJson = False) -> None:
    """Show one model: `eft models get ft:tiny-llama:bot:ftjob-...`."""
    m = _client(ctx).models.retrieve(model)
    if as_json:
        return _emit_json(m)
    out.print(_table("", "", rows=[("id", m.id), ("owned by", m.owned_by), ("created", _when(m.created))]))


COMMANDS = {"models list": models_list, "models get": models_get}
