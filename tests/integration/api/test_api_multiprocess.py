"""`tuneyard api --workers 2`: Prometheus counters summed across the processes (scrapes do
not jump between one process's numbers and another's) and JSON log lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthz_count(text: str) -> float:
    for line in text.splitlines():
        if line.startswith('tuneyard_http_requests_total{method="GET",route="/healthz"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_two_api_processes_share_their_counters(pg_stack, tmp_path) -> None:
    port, settings = _port(), pg_stack.settings
    env = {**os.environ, "TUNEYARD_DATABASE_URL": settings.database_url,
           "TUNEYARD_BROKER_URL": settings.broker_url, "TUNEYARD_AUTH": "on",
           "TUNEYARD_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}  # fmt: skip
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = (tmp_path / "api.log").open("wb")
    cmd = [sys.executable, "-m", "cli.main", "api", "--workers", "2", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=log, stdout=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()[-3000:]
            time.sleep(0.3)
        for _ in range(60):  # a new connection each: the kernel spreads them over both
            answer = httpx.get(f"{base}/healthz", headers={"X-Request-ID": "mp-test"})
            assert answer.headers["x-request-id"] == "mp-test"
        scrapes = [_healthz_count(httpx.get(f"{base}/metrics").text) for _ in range(8)]
        assert min(scrapes) >= 61 and len(set(scrapes)) == 1, scrapes
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    lines = [json.loads(x) for x in (tmp_path / "api.log").read_text().splitlines()
             if x.startswith("{")]  # fmt: skip
    assert any(entry["logger"] == "tuneyard.api" for entry in lines), lines[:5]
    assert all({"ts", "level", "logger", "msg"} <= set(entry) for entry in lines)
