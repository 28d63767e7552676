"""Probe files of the worker and scheduler loops: alive when fresh, ready when connected."""

from __future__ import annotations

import json
import subprocess
import sys

from worker import health


def test_a_fresh_mark_is_alive_and_ready(tmp_path):
    health.mark("worker", ok=True, directory=tmp_path)
    assert health.check("worker", 60, ready=True, directory=tmp_path).healthy


def test_a_failed_pass_is_alive_but_not_ready(tmp_path):
    health.mark(
        "scheduler", ok=False, detail="reconcile failed: OperationalError", directory=tmp_path
    )
    assert health.check("scheduler", 60, directory=tmp_path).healthy
    verdict = health.check("scheduler", 60, ready=True, directory=tmp_path)
    assert not verdict.healthy and "OperationalError" in verdict.reason


def test_a_stale_or_missing_or_corrupt_file_is_not_alive(tmp_path):
    assert "has not run" in health.check("worker", 60, directory=tmp_path).reason
    (tmp_path / "worker.json").write_text(json.dumps({"ts": 0, "ok": True}))
    verdict = health.check("worker", 60, directory=tmp_path)
    assert not verdict.healthy and "limit 60s" in verdict.reason
    (tmp_path / "worker.json").write_text("{not json")
    assert not health.check("worker", 60, directory=tmp_path).healthy


def test_mark_never_raises_where_it_cannot_write(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    health.mark("worker", ok=True, directory=blocker / "sub")  # a file in the way: no error


def test_the_cli_exit_codes(tmp_path):
    env = {"TUNEYARD_HEALTH_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def probe(*args: str) -> int:
        cmd = [sys.executable, "-m", "cli.main", "health", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True).returncode

    assert probe("worker") == 1
    health.mark("worker", ok=False, directory=tmp_path)
    assert probe("worker") == 0
    assert probe("worker", "--ready") == 1
    assert probe("bogus") == 2
