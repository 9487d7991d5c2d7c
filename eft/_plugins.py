"""Commands other installed packages add to `eft`, through the `eft.commands` entry-point group.

The server's commands (`eft up`, `eft down`, `eft keys`) register this way (pyproject.toml), so
the client never imports server code. An entry point names a module with a `COMMANDS` table
("group name" -> function) and, optionally, `GROUPS` ("group" -> help); it takes what commands
share (the client, options, tables, JSON and errors) from `eft.cli.output`, the CLI's one public
module for commands, imports only what the client has (typer, rich, eft) and loads anything
heavier inside a command.
"""

from __future__ import annotations

from importlib import metadata
from types import ModuleType

GROUP = "eft.commands"


def command_modules() -> list[ModuleType]:
    """The modules every installed `eft.commands` entry point names, in name order."""
    modules = []
    for entry in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            modules.append(entry.load())
        except ImportError:  # a plugin whose own dependencies are missing adds nothing
            continue
    return modules
