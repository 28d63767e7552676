"""End-to-end fixtures: a real tuneyard API (and worker) as subprocesses on real services.

Each test module gets its own PostgreSQL database `tuneyard_e2e_<module>` (created fresh,
migrated, dropped afterwards), Redis DB 3 as the broker, a temporary TUNEYARD_HOME, an
admin API key, and `tuneyard api` on a free port. `Stack.start_worker()` adds a real
`tuneyard worker`. `Stack.drive(job_id, *states)` moves a job through the state machine
with the same transition function the worker calls, for tests about clients, not training.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# A recipe every part accepts: a tiny Llama built from its config on mock tokens (no files).
VALID_RECIPE = """\
step_scheduler: {max_steps: 40, global_batch_size: 4, log_interval: 1}
model:
  _target_: tuneyard.models.AutoModelForCausalLM.from_config
  config: {architectures: [LlamaForCausalLM], model_type: llama, vocab_size: 512,
           hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
           num_attention_heads: 4, num_key_value_heads: 2}
dataset: {_target_: tuneyard.datasets.MockDataset, vocab_size: 512, seq_length: 32, num_samples: 64}
optimizer: {_target_: torch.optim.AdamW, lr: 1.0e-3}
"""
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/3"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def recreate_database(name: str, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def cli_has(command: str) -> bool:
    from typer.main import get_command

    from cli.main import app

    return command in get_command(app).commands


def tuneyard_argv() -> list[str]:
    """`python -m cli.main`, or main's app plus the client and local commands while main's
    topic list lacks them (cli/main.py belongs to the lead)."""
    if cli_has("submit") and cli_has("demo"):
        return [sys.executable, "-m", "cli.main"]
    code = ("import cli.client_cmds as c, cli.local_cmds as l; from cli.main import app; "
            "c.register(app); l.register(app); app(prog_name='tuneyard')")  # fmt: skip
    return [sys.executable, "-c", code]


@pytest.fixture(scope="session")
def tuneyard() -> list[str]:
    """The argv that runs the `tuneyard` CLI."""
    return tuneyard_argv()


@pytest.fixture(scope="session")
def valid_recipe() -> str:
    return VALID_RECIPE


def services_available() -> str | None:
    """Why the real services cannot be used, or None when PostgreSQL and Redis answer."""
    try:
        import psycopg

        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
    except Exception as exc:  # any failure means no PostgreSQL for these tests
        return f"PostgreSQL at 127.0.0.1:5432 unavailable: {exc}"
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()
    except Exception as exc:
        return f"Redis at 127.0.0.1:6379 unavailable: {exc}"
    return None


@dataclass
class Stack:
    home: Path
    database_url: str
    port: int
    api_key: str = ""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    cli_argv: list[str] = field(default_factory=lambda: tuneyard_argv())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "TUNEYARD_HOME": str(self.home), "TUNEYARD_DATABASE_URL": self.database_url,
            "TUNEYARD_BROKER_URL": REDIS_URL, "TUNEYARD_AUTH": "on",
            "TUNEYARD_URL": self.url, "TUNEYARD_API_KEY": self.api_key,
            "TUNEYARD_DATA_ROOTS": f"{self.home}{os.pathsep}{ROOT}",
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
        })  # fmt: skip
        return env

    @property
    def settings(self):
        from jobs.store.settings import Settings

        return Settings(home=self.home, database_url=self.database_url, broker_url=REDIS_URL)

    def start(self, name: str, *args: str, argv: list[str] | None = None) -> subprocess.Popen:
        log = (self.home / f"{name}.log").open("a")
        argv = argv or [sys.executable, "-m", "cli.main", name, *args]
        proc = subprocess.Popen(
            argv, env=self.env, cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def start_api(self) -> None:
        address = ["--host", "127.0.0.1", "--port", str(self.port)]
        if cli_has("api"):
            self.start("api", *address)
        else:  # `tuneyard api` (helper D) not registered yet: the same app under uvicorn
            self.start("api", argv=[sys.executable, "-m", "uvicorn", "api.main:app", *address])
        self.wait_for("/healthz", "api")

    def start_worker(self) -> None:
        self.start("worker", "-Q", "cpu")

    def wait_for(self, path: str, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited: {self.log(name)[-3000:]}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{name} not ready after {timeout}s: {self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        import signal

        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30
        )

    def drive(self, job_id: str, *states: str, **fields) -> None:
        """Move a job through `states` with the state machine's own transition function."""
        from jobs.orchestration.states import transition
        from jobs.store.engine import session_scope

        for state in states:
            with session_scope(self.settings) as session:
                extra = fields if state == states[-1] else {}
                transition(session, job_id, state, reason="e2e test", **extra)


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory) -> Iterator[Stack]:
    reason = services_available()
    if reason:
        pytest.skip(reason)
    import redis

    from jobs.store.api_keys import create_api_key
    from jobs.store.engine import dispose_engines, session_scope, upgrade_database

    name = f"tuneyard_e2e_{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_')}"
    recreate_database(name)
    redis.Redis.from_url(REDIS_URL).flushdb()
    home = tmp_path_factory.mktemp("home")
    stack = Stack(home, f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", free_port())
    upgrade_database(stack.settings)
    with session_scope(stack.settings) as session:
        stack.api_key = create_api_key(session, "e2e", "admin")[1]
    try:
        stack.start_api()
        yield stack
    finally:
        stack.stop()
        dispose_engines()
        recreate_database(name, drop_only=True)
