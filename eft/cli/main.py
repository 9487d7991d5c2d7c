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

from typing import Annotated

import typer

from eft import _plugins
from eft.cli import files, jobs, models, plan, watch
from eft.cli.output import guarded, make_client
from eft.client import __version__

__all__ = ["COMMANDS", "app", "make_client"]

app = typer.Typer(help="Elastic fine-tuning on Ray.", no_args_is_help=True)
jobs_app = typer.Typer(help="Create, inspect, pause, resume, cancel and wait for fine-tuning jobs.",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


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




COMMANDS = dict(jobs.COMMANDS)
GROUPS: dict[str, typer.Typer] = {"": app, "jobs": jobs_app}
for _module in (watch, files, models, plan, *_plugins.command_modules()):
    COMMANDS.update(_module.COMMANDS)
    for _group_name, _help in getattr(_module, "GROUPS", {}).items():
        GROUPS[_group_name] = typer.Typer(help=_help, no_args_is_help=True)
        app.add_typer(GROUPS[_group_name], name=_group_name)
for _name, _command in COMMANDS.items():
    _group, _, _leaf = _name.rpartition(" ")
    GROUPS[_group].command(_leaf)(guarded(_command))
