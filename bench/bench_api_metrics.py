"""Benchmark: `GET /v1/jobs/{id}/metrics?max_points=1000` on a job with 200,000 train records.

Loads 200k MetricsSample rows into a throwaway PostgreSQL database with COPY, serves the API
with uvicorn, and times over HTTP (median of N): the downsampled history
(`max_points=1000`, whole run), the last 1,000 raw records (`after_step=199000`), an
empty poll (`after_step=<last step>`: nothing new) and a repeated page with its ETag
(`If-None-Match`: 304), and prints each beside the raw page as a ratio. COPY fires the
rollup triggers, so the downsampled read is served as in production.
Run: `python bench/bench_api_metrics.py [--rows 200000] [--repeat 20]`.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api_submit import api_server, percentile, pg_database  # noqa: E402


def load_metrics(url: str, rows: int) -> str:
    """A job with `rows` train records, written with COPY; returns its id."""
    from sqlalchemy.orm import Session

    from jobs.store.engine import make_engine
    from jobs.store.tables import Job, Project

    engine = make_engine(url)
    with Session(engine) as session:
        project = session.query(Project).filter_by(name="bench").one()
        job = Job(project_id=project.id, name="long-run", queue="cpu")
        session.add(job)
        session.commit()
        job_id = job.id
    rng = random.Random(0)
    raw = engine.raw_connection()
    with (
        raw.cursor() as cur,
        cur.copy(
            "COPY metrics (job_id, attempt, kind, step, epoch, loss, grad_norm, lr, tps, "
            "num_tokens, timestamp) FROM STDIN"
        ) as copy,
    ):
        for step in range(1, rows + 1):
            loss = 3.0 * math.exp(-step / 40_000) + 0.05 * rng.random()
            copy.write_row(
                (
                    job_id,
                    1,
                    "train",
                    step,
                    step // 10_000,
                    loss,
                    1.0,
                    1e-4,
                    5e4,
                    step * 4096,
                    1.7e9 + step,
                )
            )
    raw.commit()
    with raw.cursor() as cur:
        cur.execute("ANALYZE metrics")
    raw.commit()
    raw.close()
    engine.dispose()
    return job_id


def time_get(
    client: httpx.Client, path: str, params: dict, repeat: int, headers: dict | None = None
) -> tuple[list[float], int]:
    client.get(path, params=params, headers=headers)  # warm caches
    times, count = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        answer = client.get(path, params=params, headers=headers)
        times.append((time.perf_counter() - start) * 1000)
        if answer.status_code == 304:
            count = 0
            continue
        answer.raise_for_status()
        count = len(answer.json()["data"])
    return times, count


def time_get_plain(client: httpx.Client, path: str, repeat: int) -> tuple[list[float], int]:
    """The same loop for a route without auth or database (what any answer costs here)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        client.get(path).raise_for_status()
        times.append((time.perf_counter() - start) * 1000)
    return times, 0


def line(label: str, times: list[float], n: int, base: float) -> str:
    median = statistics.median(times)
    return (
        f"  {label:<28}: median {median:6.1f} ms, p99 {percentile(times, 0.99):6.1f} ms, "
        f"{n:5d} records, {median / base:5.2f}x the raw page"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        pg_database() as url,
        api_server(url, Path(tmp)) as (base, key),
    ):
        start = time.perf_counter()
        job_id = load_metrics(url, args.rows)
        load_s = time.perf_counter() - start
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            path = f"/v1/jobs/{job_id}/metrics"
            raw_q = {"after_step": args.rows - 1000, "limit": 1000}
            raw, n_raw = time_get(client, path, raw_q, args.repeat)
            down, n_down = time_get(client, path, {"max_points": 1000}, args.repeat)
            empty, n_empty = time_get(client, path, {"after_step": args.rows}, args.repeat)
            etag = client.get(path, params=raw_q).headers["etag"]
            same, _ = time_get(client, path, raw_q, args.repeat, {"If-None-Match": etag})
            floor, _ = time_get_plain(client, "/healthz", args.repeat)
    base_ms = statistics.median(raw)
    print(
        f"{args.rows} train records loaded with COPY in {load_s:.1f} s; "
        f"median of {args.repeat} HTTP GETs each, one uvicorn process, {os.cpu_count()} CPUs"
    )
    print(line("last 1000 raw records", raw, n_raw, base_ms))
    print(line("max_points=1000 (whole run)", down, n_down, base_ms))
    print(line("empty poll (nothing new)", empty, n_empty, base_ms))
    print(line("same page, If-None-Match", same, 0, base_ms))
    print(line("GET /healthz (HTTP floor)", floor, 0, base_ms))


if __name__ == "__main__":
    main()
