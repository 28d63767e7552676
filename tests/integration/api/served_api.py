"""`tuneyard api` as a child process, for tests that need the real server: raw sockets,
uvicorn's own options, and the server's log as it would be written in a deployment.

The server runs on the embedded SQLite default in its own TUNEYARD_HOME (migrated first),
with every `TUNEYARD_*` variable of the test process dropped and the given ones set. Its
stderr (the JSON log lines) goes to `<home>/api.log`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
START_S = 60.0


@dataclass(frozen=True)
class ServedApi:
    url: str
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(home: Path, settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEYARD_")}
    env.update({"TUNEYARD_HOME": str(home), "TUNEYARD_LOG_FORMAT": "json", **settings})
    return env


def _wait_until_up(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"tuneyard api exited:\n{log.read_text()[-3000:]}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"tuneyard api did not answer in {START_S}s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def serve_api(home: Path, settings: dict[str, str]) -> Iterator[ServedApi]:
    """Migrate, then run `tuneyard api` on a free port until the block ends."""
    home.mkdir(parents=True, exist_ok=True)
    env = _environment(home, settings)
    command = [sys.executable, "-m", "cli.main"]
    subprocess.run([*command, "migrate"], env=env, cwd=REPO, check=True, capture_output=True)
    port, log = free_port(), home / "api.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [*command, "api", "--port", str(port)], env=env, cwd=REPO, stderr=sink
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, server, log)
        yield ServedApi(url, port, log)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
