"""Dispatch overhead: `POST /v1/jobs` to the first train record in PostgreSQL, minus the time
the same `torchrun` command takes to its first step when run by hand (median of N each).

    python3 bench/bench_dispatch_overhead.py [--runs 5]

Uses PostgreSQL on 127.0.0.1:5432 (its own database `tuneyard_worker_bench_<hex>`, dropped
at the end), Redis DB 2 (flushed), one `tuneyard worker` process with default timings, the
API in-process, and the tiny Llama from `trainer/assets.py` on CPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/2"


def tiny_recipe(base: Path, max_steps: int) -> dict:
    from jobs.recipe.validation import validate_job
    from trainer.assets import build_tiny_llama, write_instruction_jsonl

    model = build_tiny_llama(base / "model")
    data = write_instruction_jsonl(base / "train.jsonl", n=256)
    dataset = {
        "_target_": "tuneyard.datasets.JsonlInstructionDataset",
        "path": str(data),
        "tokenizer_name_or_path": str(model),
        "max_seq_length": 32,
    }
    recipe = {
        "step_scheduler": {
            "max_steps": max_steps,
            "global_batch_size": 4,
            "local_batch_size": 4,
            "checkpoint_interval": max_steps,
            "log_interval": 1,
        },
        "rng": {"seed": 0},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model),
            "dtype": "float32",
        },
        "dataset": dataset,
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
        "checkpoint": {"enabled": True},
    }
    result = validate_job(recipe, resources={"nnodes": 1, "nproc_per_node": 1})
    assert result.valid, result.errors
    return result.recipe


def wait_until(predicate, timeout: float = 120.0, every: float = 0.005) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(every)
    raise TimeoutError("timed out")


def by_hand(recipe: dict, base: Path) -> float:
    """Seconds from starting torchrun to the first train record in metrics.jsonl."""
    from worker.launcher import LaunchSpec, build_command, build_env, write_recipe

    run_dir = base / f"hand-{uuid.uuid4().hex[:6]}"
    write_recipe(run_dir, recipe)
    spec = LaunchSpec(job_id="hand", attempt=1, run_dir=run_dir)
    metrics = run_dir / "metrics.jsonl"
    start = time.perf_counter()
    proc = subprocess.Popen(
        build_command(spec),
        env=build_env(spec),
        cwd=run_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = wait_until(lambda: metrics.exists() and b'"train"' in metrics.read_bytes())
    proc.wait(120)
    return first - start


def through_service(client, recipe: dict, parts: list[tuple[float, float]]) -> float:
    """Seconds from POST /v1/jobs to the first train record in the metrics table; appends
    (POST -> torchrun started, record written -> visible in PostgreSQL) to `parts`."""
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import Job, Metric

    factory = session_factory()
    start, posted_at = time.perf_counter(), time.time()
    response = client.post("/v1/jobs", json={"name": "bench", "recipe": recipe})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    seen: list[float] = []

    def first_record() -> bool:
        with factory() as session:
            stmt = select(Metric.timestamp).where(Metric.job_id == job_id).order_by(Metric.step)
            written = session.scalar(stmt.limit(1))
        if written is not None:
            seen.extend([written, time.time()])
        return written is not None

    first = wait_until(first_record, every=0.02)
    with factory() as session:
        wait_until(
            lambda: session.get(Job, job_id, populate_existing=True).status == "succeeded",
            every=0.2,
        )
        started = session.get(Job, job_id).started_at.timestamp()
    parts.append((started - posted_at, seen[1] - seen[0]))
    return first - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import psycopg
    import redis
    from sqlalchemy import create_engine

    base = Path(tempfile.mkdtemp(prefix="tuneyard-bench-dispatch-"))
    name = f"tuneyard_worker_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {
        "TUNEYARD_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
        "TUNEYARD_BROKER_URL": REDIS_URL,
        "TUNEYARD_HOME": str(base / "home"),
        "TUNEYARD_DATA_ROOTS": str(base),
        "TUNEYARD_CHECKPOINT_ROOTS": str(base),
        "TUNEYARD_AUTH": "off",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    os.environ.update(env)
    redis.Redis.from_url(REDIS_URL).flushdb()
    worker = None
    try:
        from jobs.store.tables import Base

        Base.metadata.create_all(create_engine(env["TUNEYARD_DATABASE_URL"]))
        recipe = tiny_recipe(base, args.steps)
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "worker",
                "-Q",
                "cpu",
                "--name",
                "bench",
                "--loglevel",
                "WARNING",
            ],
            cwd=REPO,
            env=os.environ.copy(),
            start_new_session=True,
        )
        time.sleep(5)  # let the worker connect
        from fastapi.testclient import TestClient

        from api.main import create_app

        hand, service, parts = [], [], []
        with TestClient(create_app()) as client:
            for _ in range(args.runs):  # interleaved, so load drift hits both alike
                hand.append(by_hand(recipe, base))
                service.append(through_service(client, recipe, parts))
        h, s = statistics.median(hand), statistics.median(service)
        diff = statistics.median(b - a for a, b in zip(hand, service, strict=True))
        print(
            f"runs: {args.runs} each, interleaved; tiny Llama, 1 CPU rank, "
            f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
        )
        print(
            f"torchrun by hand, start -> first train record in file: median {h:.2f} s  "
            f"{[round(x, 2) for x in hand]}"
        )
        print(
            f"POST /v1/jobs -> first train record in PostgreSQL:     median {s:.2f} s  "
            f"{[round(x, 2) for x in service]}"
        )
        launch = statistics.median(p[0] for p in parts)
        ingest = statistics.median(p[1] for p in parts)
        print(
            f"  of which POST -> torchrun started: median {launch:.3f} s; "
            f"record written -> visible in PostgreSQL: median {ingest:.3f} s"
        )
        print(
            f"dispatch overhead: difference of medians {s - h:.2f} s, "
            f"median of paired differences {diff:.2f} s"
        )
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
        from jobs.store.engine import dispose_engines

        dispose_engines()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
