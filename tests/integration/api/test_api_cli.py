"""`tuneyard migrate`, `tuneyard keys create|revoke`, `tuneyard api` and deploy/prestart.sh,
run as real processes from a directory outside the repo."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pg_databases import create_pg_database, drop_pg_database
from sqlalchemy import inspect
from sqlalchemy.orm import Session

from jobs.store.api_keys import verify_key
from jobs.store.engine import make_engine

REPO = Path(__file__).resolve().parents[3]


def tuneyard(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def env_for(url: str, home: Path) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TUNEYARD_DATABASE_URL": url, "TUNEYARD_HOME": str(home),
            "PYTHONPATH": pythonpath}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cli.db'}"
        return
    url = create_pg_database()
    yield url
    drop_pg_database(url)


def test_migrate_and_keys(empty_url, tmp_path) -> None:
    env = env_for(empty_url, tmp_path / "home")
    migrated = tuneyard(["migrate", "--wait", "5"], env, tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    engine = make_engine(empty_url)
    assert "jobs" in inspect(engine).get_table_names()
    created = tuneyard(["keys", "create", "--project", "team-a", "--role", "submit"], env, tmp_path)
    assert created.returncode == 0, created.stderr
    raw = created.stdout.strip()
    with Session(engine) as s:
        principal = verify_key(s, raw)
    assert principal is not None and (principal.project_name, principal.role) == (
        "team-a",
        "submit",
    )
    revoked = tuneyard(["keys", "revoke", str(principal.key_id)], env, tmp_path)
    assert revoked.returncode == 0
    with Session(engine) as s:
        assert verify_key(s, raw) is None
    assert tuneyard(["keys", "revoke", str(principal.key_id)], env, tmp_path).returncode == 1
    engine.dispose()


def test_keys_create_refuses_an_unknown_role(tmp_path) -> None:
    env = env_for(f"sqlite:///{tmp_path / 'x.db'}", tmp_path)
    result = tuneyard(["keys", "create", "--project", "p", "--role", "admn"], env, tmp_path)
    assert result.returncode == 2 and "did you mean 'admin'" in result.stderr


def test_keys_create_refuses_a_project_name_a_new_project_may_not_have(tmp_path) -> None:
    env = env_for(f"sqlite:///{tmp_path / 'x.db'}", tmp_path)
    assert tuneyard(["migrate"], env, tmp_path).returncode == 0
    result = tuneyard(["keys", "create", "--project", "Team-A", "--role", "read"], env, tmp_path)
    assert result.returncode == 2 and "is not a project name" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_prestart_migrates_and_gives_up_on_an_unreachable_database(tmp_path) -> None:
    script = REPO / "deploy" / "prestart.sh"
    ok = subprocess.run(["sh", str(script)], env=env_for(f"sqlite:///{tmp_path / 'p.db'}",
                        tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    env = env_for("postgresql://postgres@127.0.0.1:1/nowhere", tmp_path)
    env["TUNEYARD_DB_WAIT_SECONDS"] = "2"
    down = subprocess.run(["sh", str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert down.returncode == 1 and "not reachable" in down.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_api_command_serves_the_app(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    env = env_for(url, tmp_path)
    assert tuneyard(["migrate"], env, tmp_path).returncode == 0
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "api", "--port", str(port)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("tuneyard api did not answer within 60 s")
        assert answer.json()["status"] == "ok"
        assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs").status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)
