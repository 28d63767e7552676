"""`tuneyard health worker|scheduler [--ready]`: exit 0 healthy, 1 not, 2 for an unknown role."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from cli import worker_cmds
from worker import health


def _health(*args: str):
    app = typer.Typer()
    worker_cmds.register(app)
    return CliRunner().invoke(app, ["health", *args])


def test_a_fresh_mark_is_healthy_and_a_missing_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEYARD_HEALTH_DIR", str(tmp_path))
    assert _health("worker").exit_code == 1  # the loop has not run yet
    health.mark("worker", ok=True, directory=tmp_path)
    assert _health("worker", "--ready").exit_code == 0


def test_ready_needs_the_last_pass_to_reach_the_database(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEYARD_HEALTH_DIR", str(tmp_path))
    health.mark("scheduler", ok=False, detail="database down", directory=tmp_path)
    assert _health("scheduler").exit_code == 0
    assert _health("scheduler", "--ready").exit_code == 1


def test_an_unknown_role_exits_2():
    done = _health("api")
    assert done.exit_code == 2
    assert "role must be one of worker, scheduler" in done.output
