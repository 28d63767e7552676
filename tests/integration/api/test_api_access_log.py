"""The per-request access log: on by default under `tuneyard api`, off under `tuneyard up`
(whose dashboard polls every few seconds), as the real processes write their logs.

The API runs as the child process `up` starts (`LocalStack.command("api")`, the argv `up`
uses) and as a plain `tuneyard api`, each on its own embedded SQLite home."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from served_api import free_port

from cli.local_cmds import LocalStack

REPO = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def running(argv: list[str], home: Path, port: int) -> Iterator[Path]:
    """Migrate `home`, run `argv` until the block ends; yields the file its stderr goes to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEYARD_")}
    env.update({"TUNEYARD_HOME": str(home), "TUNEYARD_LOG_FORMAT": "json"})
    home.mkdir(parents=True)
    migrate = [sys.executable, "-m", "cli.main", "migrate"]
    subprocess.run(migrate, env=env, cwd=REPO, check=True, capture_output=True)
    log = home / "api.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(argv, env=env, cwd=REPO, stderr=sink)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield log
    finally:
        server.terminate()
        server.wait(timeout=20)


def access_lines(log: Path, port: int) -> list[str]:
    for _ in range(3):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
    time.sleep(0.5)
    return [line for line in log.read_text().splitlines() if "tuneyard.access" in line]


def test_up_starts_the_api_without_access_log(tmp_path) -> None:
    port = free_port()
    argv = LocalStack("127.0.0.1", port).command("api")
    assert "--no-access-log" in argv
    with running(argv, tmp_path / "home", port) as log:
        assert access_lines(log, port) == []


def test_up_access_log_flag_and_plain_api_keep_it(tmp_path) -> None:
    assert "--access-log" in LocalStack("127.0.0.1", 1, access_log=True).command("api")
    port = free_port()
    argv = [sys.executable, "-m", "cli.main", "api", "--port", str(port)]
    with running(argv, tmp_path / "home", port) as log:
        lines = access_lines(log, port)
    assert any('\\"GET /v1/models\\" ' in line for line in lines), lines
