"""The CLI's HTTP client and error printing, and the CLI override grammar, without a server.

Error answers are built as httpx.Response objects in the API's shapes (api/errors.py), so a
change of shape on either side shows here as a wrong message, not as raw JSON on a user's
terminal. `tuneyard validate` must not pay for httpx or rich: checked in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli.client_cmds import override_strings, report_error
from cli.http_client import ClientError, CliExitCode, error_from_response, items_of
from jobs.recipe.errors import RecipeInvalid
from jobs.recipe.load.overrides import parse_overrides

ROOT = Path(__file__).resolve().parents[2]


def conflict() -> httpx.Response:
    error = {"code": "illegal_transition", "message": "cannot pause a failed job",
             "current_status": "failed", "job_id": "j1"}  # fmt: skip
    return httpx.Response(409, json={"error": error})


def test_a_409_carries_the_message_and_the_current_state():
    error = error_from_response(conflict())
    assert str(error) == "cannot pause a failed job"
    assert error.current_status == "failed"
    assert error.exit_code == CliExitCode.REFUSED


def test_a_422_carries_each_field_error():
    errors = [{"loc": "optimizer.lrr", "msg": "unknown field", "fix": "did you mean 'lr'?"},
              {"loc": "resources.nproc_per_node", "msg": "too small", "fix": "use >= 1"}]  # fmt: skip
    error = error_from_response(httpx.Response(422, json={"errors": errors}))
    assert str(error) == "the server refused the request (2 problems):"
    assert error.errors == errors and error.exit_code == CliExitCode.REFUSED


@pytest.mark.parametrize(
    ("status", "body", "message", "exit_code"),
    [
        (404, {"error": {"code": "not_found", "message": "job x not found"}},
         "job x not found", CliExitCode.REFUSED),
        (403, {"error": {"code": "forbidden", "message": "role 'read' cannot submit"}},
         "role 'read' cannot submit", CliExitCode.REFUSED),
        (401, {"error": {"code": "unauthorized", "message": "unknown or revoked API key"}},
         "unknown or revoked API key; set TUNEYARD_API_KEY", CliExitCode.REFUSED),
        (500, {"error": {"code": "internal", "message": "internal server error"}},
         "internal server error", CliExitCode.UNREACHABLE),
    ],
)  # fmt: skip
def test_other_errors_read_error_message(status, body, message, exit_code):
    error = error_from_response(httpx.Response(status, json=body))
    assert str(error).startswith(message)
    assert error.exit_code == exit_code and error.current_status is None


def test_a_body_that_is_not_json_is_shown_as_text():
    error = error_from_response(httpx.Response(502, text="<h1>Bad   gateway</h1>\n"))
    assert str(error) == "HTTP 502: <h1>Bad gateway</h1>"
    assert error.exit_code == CliExitCode.UNREACHABLE
    assert str(error_from_response(httpx.Response(503))) == "HTTP 503"


def test_report_error_prints_the_state_and_fields_not_json(capsys):
    assert report_error(error_from_response(conflict())) == CliExitCode.REFUSED
    assert capsys.readouterr().err.splitlines() == [
        "error: cannot pause a failed job",
        "  current state: failed",
    ]
    fields = [{"loc": "labels.<key>.[key]", "msg": "bad [label]", "fix": "use [a-z]"}]
    report_error(ClientError("refused:", CliExitCode.REFUSED, fields))
    # Brackets in the server's text are printed as sent, not read as rich markup.
    assert "  labels.<key>.[key]: bad [label]  fix: use [a-z]" in capsys.readouterr().err


def test_items_of_reads_collections_only():
    assert items_of({"data": [1, 2], "next_cursor": None}) == [1, 2]
    assert items_of(None) == [] and items_of("text") == []


@pytest.mark.parametrize(
    "tokens",
    [
        ["--optimizer.lr", "1e-4", "--rng.seed=3", "step_scheduler.max_steps=9"],
        ["--checkpoint.enabled"],
        ["--checkpoint.enabled", "--optimizer.lr", "1e-4", "--peft.enabled"],
        ["--flag", "x=y"],  # a bare --key takes the next token that is not an option
        ["--dataset.path=/data/a=b.jsonl", "--optimizer.lr", "-1"],
        ["--checkpoint.enabled", "false", "--name.with.dots", ""],
        ["--model.tags", "[a, b]", "--rng", "{seed: 1}"],
    ],
)
def test_override_strings_mean_what_validate_reads(tokens):
    strings = override_strings(tokens)
    assert all("=" in s for s in strings)
    assert parse_overrides(strings) == parse_overrides(tokens)


def test_override_strings_keep_the_values_text_and_make_bare_flags_true():
    tokens = ["--optimizer.lr", "1e-4", "--checkpoint.enabled", "--rng.seed=3", "a.b=c"]
    assert override_strings(tokens) == [
        "optimizer.lr=1e-4",
        "checkpoint.enabled=true",
        "rng.seed=3",
        "a.b=c",
    ]


@pytest.mark.parametrize("tokens", [["optimizer.lr"], ["--bad key=1"], ["--=3"]])
def test_malformed_overrides_are_refused_like_validate_refuses_them(tokens):
    with pytest.raises(RecipeInvalid) as validated:
        parse_overrides(tokens)
    with pytest.raises(ClientError) as client:
        override_strings(tokens)
    assert client.value.errors == [e.to_dict() for e in validated.value.errors]


def test_importing_the_cli_loads_neither_httpx_nor_rich():
    code = ("import sys, cli.main; print(sorted({m.split('.')[0] for m in sys.modules}"
            " & {'httpx', 'rich', 'torch', 'transformers'}))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
