"""Fixtures and helpers for the worker's integration tests: a real PostgreSQL database of their own,
Redis DB 2, real `tuneyard worker` / `tuneyard scheduler` processes, short leases.

Each test session creates `tuneyard_worker_test_<hex>` (dropped at the end) and flushes
only Redis DB 2. Worker timings are shrunk through `TUNEYARD_WORKER_*` so a lost worker
is noticed in seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pg_databases import create_pg_database, drop_pg_database

REPO = Path(__file__).resolve().parents[3]
REDIS_URL = os.environ.get("TUNEYARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
FAKE_TRAINER = "tests.integration.worker.fake_trainer"
FAST_TIMINGS = {
    "TUNEYARD_WORKER_LEASE_SECONDS": "4",
    "TUNEYARD_WORKER_POLL_SECONDS": "0.5",
    "TUNEYARD_WORKER_INGEST_SECONDS": "0.2",
    "TUNEYARD_WORKER_HEARTBEAT_SECONDS": "1",
    "TUNEYARD_WORKER_STALE_WORKER_SECONDS": "5",
    "TUNEYARD_WORKER_STOP_GRACE_SECONDS": "8",
    "TUNEYARD_WORKER_REDISPATCH_GRACE_SECONDS": "3",
    "TUNEYARD_WORKER_RECONCILE_SECONDS": "1",
    "TUNEYARD_WORKER_GANG_WAIT_SECONDS": "60",
    "TUNEYARD_WORKER_RENDEZVOUS_HOST": "127.0.0.1",
}


def _reset_caches() -> None:
    from jobs.store.engine import dispose_engines
    from jobs.store.settings import get_settings
    from worker.config import get_worker_config

    get_settings.cache_clear()
    get_worker_config.cache_clear()
    dispose_engines()


def _forget_earlier_jobs() -> None:
    """Each test starts from no jobs and no workers: a reconciler started by this test must
    not spend its time re-running what an earlier test left half-way."""
    from sqlalchemy import delete

    from jobs.store.engine import session_scope
    from jobs.store.tables import Job, Worker

    with session_scope() as session:
        session.execute(delete(Job))
        session.execute(delete(Worker))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    url = create_pg_database()
    from sqlalchemy import create_engine

    from jobs.store.tables import Base

    engine = create_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    yield url
    _reset_caches()
    drop_pg_database(url)


@pytest.fixture()
def ty_env(
    pg_url: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    """Environment for this process and the worker processes it starts."""
    roots = str(tmp_path_factory.getbasetemp())  # holds the session's tiny assets too
    env = {
        "TUNEYARD_DATABASE_URL": pg_url,
        "TUNEYARD_BROKER_URL": REDIS_URL,
        "TUNEYARD_HOME": str(tmp_path / "home"),
        "TUNEYARD_RUNS_DIR": str(tmp_path / "runs"),
        "TUNEYARD_DATA_ROOTS": roots,
        "TUNEYARD_CHECKPOINT_ROOTS": roots,
        "TUNEYARD_AUTH": "off",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        **FAST_TIMINGS,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    redis.Redis.from_url(REDIS_URL).flushdb()
    _reset_caches()
    _forget_earlier_jobs()
    yield env
    _reset_caches()


@pytest.fixture()
def project_id(ty_env: dict[str, str]) -> int:
    from jobs.store.engine import session_scope
    from jobs.store.tables import Project

    with session_scope() as session:  # `default`: the project TUNEYARD_AUTH=off acts in
        project = session.query(Project).filter_by(name="default").one_or_none()
        if project is None:
            project = Project(name="default")
            session.add(project)
            session.flush()
        return project.id


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Llama, its tokenizer and reverse-the-digits data, built once per session."""
    from cli.demo_assets import build_tiny_llama, write_instruction_jsonl

    base = tmp_path_factory.mktemp("assets")
    build_tiny_llama(base / "model")
    return {
        "model": base / "model",
        "train": write_instruction_jsonl(base / "train.jsonl", n=256, seed=0),
        "val": write_instruction_jsonl(base / "val.jsonl", n=32, seed=1),
    }


def tiny_recipe(
    assets: dict[str, Path], max_steps: int, *, world: int = 1, checkpoint_every: int = 25
) -> dict[str, Any]:
    """A full fine-tune of the tiny Llama for the real trainer, normalized by validation."""
    from jobs.recipe.validation import validate_job

    def dataset(path: Path) -> dict[str, Any]:
        return {"_target_": "tuneyard.datasets.JsonlInstructionDataset", "path": str(path),
                "tokenizer_name_or_path": str(assets["model"]), "max_seq_length": 32}  # fmt: skip

    recipe = {
        "step_scheduler": {"max_steps": max_steps, "num_epochs": 100_000, "global_batch_size": 4 * world,
                           "local_batch_size": 4, "val_check_interval": max_steps,
                           "checkpoint_interval": checkpoint_every, "log_interval": 1},
        "rng": {"seed": 0},
        "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "dataset": dataset(assets["train"]),
        "validation_dataset": dataset(assets["val"]),
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.0},
        "checkpoint": {"enabled": True},
    }  # fmt: skip
    resources = {"nnodes": world, "nproc_per_node": 1, "accelerator": "cpu"}
    result = validate_job(recipe, resources=resources)
    assert result.valid, result.errors
    return result.recipe


def insert_job(
    project_id: int,
    recipe: dict,
    *,
    nnodes: int = 1,
    nproc: int = 1,
    max_attempts: int = 3,
    dispatch: bool = True,
    queue: str = "cpu",
    accelerator: str = "cpu",
) -> str:
    """Store a queued job and send it to the broker after the commit, as the API does."""
    from jobs.broker import enqueue_job
    from jobs.store.engine import session_scope
    from jobs.store.queries import mark_dispatched
    from jobs.store.tables import Job

    resources = {"nnodes": nnodes, "nproc_per_node": nproc, "accelerator": accelerator}
    with session_scope() as session:
        job = Job(project_id=project_id, name="t", spec={"recipe": recipe}, recipe=recipe,
                  plan={}, resources=resources, queue=queue, max_attempts=max_attempts)  # fmt: skip
        session.add(job)
        session.flush()
        job_id = job.id
    if dispatch:
        enqueue_job(job_id, queue)
        with session_scope() as session:
            mark_dispatched(session, job_id)
    return job_id


class Procs:
    """Worker and scheduler subprocesses, each in its own session, killed at teardown."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir, self.procs = env, log_dir, {}

    def start(
        self, name: str, args: list[str], extra: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args], cwd=REPO, env={**os.environ, **self.env, **(extra or {})},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def worker(
        self, name: str, trainer: str | None = FAKE_TRAINER, concurrency: int = 1, **extra: str
    ) -> subprocess.Popen:
        env = dict(extra)
        if trainer:
            env["TUNEYARD_WORKER_TRAINER_MODULE"] = trainer
        args = ["worker", "-Q", "cpu", "--name", name, "-c", str(concurrency), "--loglevel", "INFO"]
        return self.start(name, args, env)

    def scheduler(self) -> subprocess.Popen:
        return self.start("scheduler", ["scheduler", "--loglevel", "INFO"])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)  # the worker alone: its torchrun must die of parent death
        proc.wait(10)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.log_dir.glob("*.log"))

    def close(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


@pytest.fixture()
def procs(ty_env: dict[str, str], tmp_path: Path) -> Iterator[Procs]:
    p = Procs(ty_env, tmp_path)
    yield p
    p.close()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    procs: Procs | None = None,
    every: float = 0.2,
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    detail = procs.logs() if procs else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")


def job_row(job_id: str) -> Any:
    from jobs.store.engine import session_factory
    from jobs.store.tables import Job

    with session_factory()() as session:
        return session.get(Job, job_id)


def train_steps(job_id: str) -> list[int]:
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import Metric

    with session_factory()() as session:
        stmt = select(Metric.step).where(Metric.job_id == job_id, Metric.kind == "train")
        return sorted(session.execute(stmt).scalars())


def train_metrics(job_id: str) -> list[Any]:
    """The job's stored train MetricsSample rows, by step."""
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import Metric

    with session_factory()() as session:
        stmt = select(Metric).where(Metric.job_id == job_id, Metric.kind == "train")
        return sorted(session.execute(stmt).scalars(), key=lambda m: m.step)


SETTLED = ("succeeded", "failed", "cancelled")


def run_through_service(procs: Procs, body: dict[str, Any], timeout: float, what: str,
                        check: Any = None) -> tuple[str, Any]:  # fmt: skip
    """POST the job to the API, start a worker, wait until the job settles: (job id, row).

    `check(created_json)` runs on the API's answer before the worker starts.
    """
    from fastapi.testclient import TestClient

    from api.main import create_app
    from jobs.store.settings import get_settings

    with TestClient(create_app(get_settings())) as client:
        created = client.post("/v1/jobs", json=body)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        if check is not None:
            check(created.json())
        procs.worker("w1", trainer=None)
        row = wait_for(lambda: (r := job_row(job_id)).status in SETTLED and r, timeout, what,
                       procs)  # fmt: skip
    assert row.status == "succeeded", (row.error_code, row.error_message, procs.logs())
    return job_id, row


def events_of(job_id: str) -> list[Any]:
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import JobEvent

    with session_factory()() as session:
        stmt = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        return list(session.execute(stmt).scalars())


class TcpProxy:
    """A TCP forwarder in front of PostgreSQL that a test can cut and restore (an outage
    for the worker only; the shared server keeps running)."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        import socket
        import threading

        self.target = target
        self._socket_mod, self._threading = socket, threading
        self.port = self._free_port()
        self._conns: list[Any] = []
        self._listener: Any = None
        self.start()

    def _free_port(self) -> int:
        with self._socket_mod.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def start(self) -> None:
        sock = self._socket_mod.socket()
        sock.setsockopt(self._socket_mod.SOL_SOCKET, self._socket_mod.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._listener = sock
        self._threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, listener: Any) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if listener is not self._listener:  # accepted while being stopped
                client.close()
                return
            upstream = self._socket_mod.create_connection(self.target)
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                self._threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(self._socket_mod.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(self._socket_mod.SHUT_RDWR)
                conn.close()
        self._conns.clear()

    def url(self, pg_url: str) -> str:
        return pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{self.port}")


def no_process_mentions(run_dir: str) -> bool:
    """No live process has the run directory on its command line (nothing of it survived)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if run_dir.encode() in cmdline.read_bytes():
                return False
        except OSError:
            continue
    return True


@pytest.fixture
def store_env(s3_server, ty_env, monkeypatch) -> Iterator[dict[str, str]]:
    """The artifact store in the test SeaweedFS bucket (a prefix of this test's own) for
    this process and the workers it starts."""
    env = s3_server.env(prefix=f"w-{uuid.uuid4().hex[:8]}")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from jobs.store.settings import get_settings

    get_settings.cache_clear()
    yield env
    get_settings.cache_clear()
