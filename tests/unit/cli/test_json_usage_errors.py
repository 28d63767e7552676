"""Usage errors under `--json` (issue 32): the CLI's JSON error on stdout, exit code 2; without
`--json` Click's own text on stderr, as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app, asks_for_json

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("args", "message", "param"),
    [
        (["status", "--bogus", "--json"], "No such option: --bogus", None),
        (["status", "--json"], "Missing argument 'job_id'.", "job_id"),
        (["jobs", "--limit", "abc", "--json"], "Invalid value for '--limit'", "limit"),
        (["no-such-command", "--json"], "No such command 'no-such-command'.", None),
        (["--json", "status", "x"], "No such option: --json", None),  # no global --json
    ],
)
def test_usage_errors_under_json_are_the_cli_error_shape_on_stdout(args, message, param):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr == ""
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "usage_error" and error["exit_code"] == 2
    assert error["message"].startswith(message)
    assert error["http_status"] is None and error["usage"].startswith("Usage: ")
    assert error.get("param") == param


def test_usage_errors_without_json_stay_clicks_text_on_stderr():
    result = CliRunner().invoke(app, ["status", "--bogus"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such option" in result.stderr and "Usage:" in result.stderr


def test_json_after_double_dash_is_an_argument_not_the_flag():
    assert asks_for_json(["status", "--json"])
    assert not asks_for_json(["status", "--", "--json"])
    result = CliRunner().invoke(app, ["status", "--bogus", "--", "--json"])
    assert result.exit_code == 2 and result.stdout == ""


def test_the_installed_entry_answers_json_usage_errors(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "wait", "--timeout", "soon", "--json", "abcdef12"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""
    error = json.loads(done.stdout)["error"]
    assert error["param"] == "timeout" and "Invalid value for '--timeout'" in error["message"]
