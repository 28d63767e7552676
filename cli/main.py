"""The `tuneyard` command line: one typer app, commands registered by topic modules.

Each topic module (validate, server, worker, ...) exposes `register(app)`; this file only
assembles them, so `tuneyard validate` imports nothing it does not need (no torch).

A usage error (unknown option, missing argument, a value of the wrong type) is Click's
`UsageError` (Typer 0.2x runs its own copy of Click, so the class is found through
`typer.BadParameter`, one of its kinds). When the command line holds `--json` (a command's
own; `tuneyard` itself has none, so `tuneyard --json status X` is such an error too),
`JsonUsageGroup` answers it the way `--json` answers every other error: one
`{"error": {...}}` document on stdout (`cli.job_views.error_json`), code `usage_error`,
exit code 2.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

_AS_JSON = "tuneyard.json_errors"  # ctx.meta key: the command line asked for --json
UsageError = next(k for k in typer.BadParameter.__mro__ if k.__name__ == "UsageError")


def asks_for_json(args: Sequence[str]) -> bool:
    """Whether a command line holds the `--json` flag (before a `--`, after which every
    token is an argument)."""
    tokens = list(args)
    return "--json" in (tokens[: tokens.index("--")] if "--" in tokens else tokens)


def answer_usage_error(error: UsageError, as_json: bool) -> NoReturn:
    """Re-raise `error` for Click to print (human text on stderr), or with `as_json` print
    it as the CLI's JSON error on stdout and exit with its code (2)."""
    if not as_json:
        raise error
    from cli.client_cmds import print_json
    from cli.http_client import ClientError, CliExitCode
    from cli.job_views import error_json

    detail: dict[str, Any] = {"usage": error.ctx.get_usage() if error.ctx else None}
    param = getattr(error, "param", None)
    if param is not None:
        detail["param"] = param.name
    refusal = ClientError(
        error.format_message(), CliExitCode(error.exit_code), code="usage_error", detail=detail
    )
    print_json(error_json(refusal))
    raise typer.Exit(error.exit_code)


class JsonUsageGroup(TyperGroup):
    """The root group: usage errors as JSON when the command line asks for `--json`.

    A top-level error (`tuneyard --bogus`) is raised while making the root context; a
    command's own (`tuneyard status --bogus --json`) while the root invokes it.
    """

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: typer.Context | None = None,
        **extra: Any,
    ) -> typer.Context:
        as_json = asks_for_json(args)  # before parsing, which consumes `args`
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except UsageError as error:
            answer_usage_error(error, as_json)
        ctx.meta[_AS_JSON] = as_json
        return ctx

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as error:
            answer_usage_error(error, bool(ctx.meta.get(_AS_JSON)))


app = typer.Typer(
    name="tuneyard",
    help="tuneyard: validate, queue and run LLM fine-tuning jobs.",
    cls=JsonUsageGroup,
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
