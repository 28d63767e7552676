"""Ingestion rate: MetricsSample records/s from `metrics.jsonl` to PostgreSQL through the
worker's own path (tail, fence, upsert), against PostgreSQL's bulk `COPY` of the same rows.

    python3 bench/bench_ingest.py [--records 50000] [--repeat 3]

Creates and drops its own database `tuneyard_worker_bench_<hex>` on 127.0.0.1:5432.
Prints both rates and their ratio (worker / COPY; higher is better, 1.0 = as fast as COPY).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
COLUMNS = (
    "job_id",
    "attempt",
    "kind",
    "step",
    "epoch",
    "loss",
    "grad_norm",
    "lr",
    "mem",
    "tps",
    "tps_per_rank",
    "mfu",
    "num_tokens",
    "timestamp",
)


def sample(step: int) -> dict:
    return {
        "kind": "train",
        "step": step,
        "epoch": 0,
        "loss": 2.0 / step,
        "grad_norm": 1.5,
        "lr": 1e-4,
        "mem": 0.37,
        "tps": 8000.0,
        "tps_per_rank": 8000.0,
        "mfu": 0.06,
        "num_tokens": 185,
        "timestamp": time.time(),
    }


def new_job(project_id: int) -> str:
    from jobs.store.engine import session_scope
    from jobs.store.tables import Job

    with session_scope() as session:
        job = Job(project_id=project_id, name="bench", resources={}, queue="cpu")
        session.add(job)
        session.flush()
        return job.id


def worker_path(project_id: int, lines: Path, records: int) -> float:
    """Seconds for the supervisor's ingestion loop to move every record into the table."""
    from jobs.store.engine import session_scope
    from jobs.store.leases import claim_job
    from worker.config import WorkerConfig
    from worker.launcher import LaunchSpec
    from worker.supervisor import AttemptSupervisor

    job_id = new_job(project_id)
    run_dir = lines.parent / job_id
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to(lines)
    with session_scope() as session:
        claim = claim_job(session, job_id, "bench", 600, str(run_dir))
    spec = LaunchSpec(job_id=job_id, attempt=claim.attempt, run_dir=run_dir)
    sup = AttemptSupervisor(claim, "bench", WorkerConfig(), spec)
    start = time.perf_counter()
    while sup.ingest_once():
        pass
    elapsed = time.perf_counter() - start
    assert sup.state.counters["metrics"] == records, sup.state.counters
    return elapsed


def copy_path(project_id: int, rows: list[dict], url: str) -> float:
    """Seconds for psycopg's COPY of the same rows (parsed from the same JSON lines)."""
    import psycopg

    job_id = new_job(project_id)
    start = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY metrics ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for raw in rows:
                record = json.loads(raw)
                copy.write_row([job_id, 1, *(record.get(c) for c in COLUMNS[2:])])
        conn.commit()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import psycopg
    from sqlalchemy import create_engine

    name = f"tuneyard_worker_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    os.environ["TUNEYARD_DATABASE_URL"] = url
    try:
        from jobs.store.engine import session_scope
        from jobs.store.tables import Base, Project

        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        Base.metadata.create_all(engine)
        with session_scope() as session:
            project = Project(name="bench")
            session.add(project)
            session.flush()
            project_id = project.id
        tmp = Path(tempfile.mkdtemp(prefix="tuneyard-bench-ingest-"))
        lines_path = tmp / "metrics.jsonl"
        raw_lines = [json.dumps(sample(s)) for s in range(1, args.records + 1)]
        lines_path.write_text("\n".join(raw_lines) + "\n")
        worker_s, copy_s = [], []
        for _ in range(args.repeat):
            worker_s.append(worker_path(project_id, lines_path, args.records))
            copy_s.append(copy_path(project_id, raw_lines, url))
        w, c = statistics.median(worker_s), statistics.median(copy_s)
        print(f"records: {args.records}, repeats: {args.repeat} (median)")
        print(
            f"worker ingestion (tail + fence + upsert): {args.records / w:,.0f} records/s ({w:.3f} s)"
        )
        print(
            f"PostgreSQL COPY of the same rows:          {args.records / c:,.0f} records/s ({c:.3f} s)"
        )
        print(f"ratio worker/COPY: {c / w:.2f}")
    finally:
        from jobs.store.engine import dispose_engines

        dispose_engines()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
