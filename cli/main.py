"""The `tuneyard` command line: one typer app, commands registered by topic modules.

Each topic module (validate, server, worker, ...) exposes `register(app)`; this file only
assembles them, so `tuneyard validate` imports nothing it does not need (no torch).
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="tuneyard",
    help="tuneyard: validate, queue and run LLM fine-tuning jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_TOPICS = (
    "cli.validate_cmd",
    "cli.server_cmds",
    "cli.worker_cmds",
    "cli.client_cmds",
    "cli.export_cmds",
    "cli.artifact_cmds",
    "cli.local_cmds",
)

for _name in _TOPICS:
    importlib.import_module(_name).register(app)


if __name__ == "__main__":
    app()
