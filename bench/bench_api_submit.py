"""Benchmark: `POST /v1/jobs` at 50 concurrent clients on PostgreSQL, against its floor.

Each run starts, on a throwaway PostgreSQL database (`tuneyard_api_test_bench_*`) with the
broker on Redis DB 1, first the bare floor app (`bench_api_floor.py`: key lookup, insert job
and event in one transaction, enqueue) and then `uvicorn api.main:app` (the full path:
auth, validation, insert, commit, enqueue), and sends both the same requests. Prints median,
p99 and throughput side by side, the ratio tuneyard / floor, and how many submits logged
"broker refused". Run: `python bench/bench_api_submit.py [--requests 500]
[--concurrency 50] [--runs 1] [--workers 1] [--variants]`. `--variants` also serves, in each
run, tuneyard's app without validation and without validation or middleware
(`bench_api_variants.py`), each with its ratio to the floor. Also provides the server
fixture `bench_api_metrics.py` reuses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/1"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    name = f"tuneyard_api_test_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def write_assets(root: Path) -> dict:
    from cli.demo_assets import write_squad_dir

    (root / "tiny_llama").mkdir(parents=True)
    (root / "tiny_llama" / "config.json").write_text(json.dumps(TINY_LLAMA))
    write_squad_dir(root / "squad", n=8)
    return {
        "step_scheduler": {"max_steps": 20, "global_batch_size": 8},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(root / "tiny_llama"),
            "dtype": "float32",
        },
        "dataset": {
            "_target_": "tuneyard.datasets.SquadDataset",
            "path_or_dataset": str(root / "squad"),
            "max_seq_length": 64,
        },
        "dataloader": {"batch_size": 4},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
    }


def prepared(url: str, tmp: Path) -> tuple[dict[str, str], str]:
    """Migrate the database at `url`; (the servers' environment, a submit key)."""
    from jobs.store.api_keys import create_api_key
    from jobs.store.engine import session_scope, upgrade_database
    from jobs.store.settings import Settings

    env = {
        "TUNEYARD_DATABASE_URL": url,
        "TUNEYARD_BROKER_URL": REDIS_URL,
        "TUNEYARD_HOME": str(tmp / "home"),
        "TUNEYARD_DATA_ROOTS": str(tmp),
        "PYTHONPATH": f"{REPO}:{REPO / 'bench'}",
        "TUNEYARD_LOG_FORMAT": "text",
    }
    settings = Settings(database_url=url)
    upgrade_database(settings)
    with session_scope(settings) as session:
        return env, create_api_key(session, "bench", "submit")[1]


@contextlib.contextmanager
def api_server(
    url: str, tmp: Path, app: str = "api.main:app", workers: int = 1, log: Path | None = None
) -> Iterator[tuple[str, str]]:
    """A migrated database, a submit key and a running uvicorn; yields (base_url, key)."""
    own, key = prepared(url, tmp)
    env = {**os.environ, **own}
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    out = log.open("ab") if log else None
    proc = subprocess.Popen(cmd, env=env, cwd=tmp, stderr=out)
    api_server.pid = proc.pid  # type: ignore[attr-defined]  (for server_cpu_seconds)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        yield base, key
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if out:
            out.close()


# `--variants`: tuneyard's app with parts taken out (`bench_api_variants.py`).
VARIANTS = {
    "without validation": "bench_api_variants:without_validation",
    "without valid., mw": "bench_api_variants:without_validation_or_middleware",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def post_many(
    base: str, key: str, body: dict, total: int, concurrency: int
) -> tuple[list[float], float]:
    """(latencies, seconds) of `total` submits from `concurrency` clients, each with its own
    keep-alive connection, opened before the clock starts. (One shared httpx pool parked
    some requests a second or more before sending them under this load: waits on the
    client's side that neither server ever saw.)"""
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=1)
    clients = [
        httpx.AsyncClient(base_url=base, headers=headers, timeout=120, limits=limits, verify=False)
        for _ in range(concurrency)
    ]
    try:
        await asyncio.gather(*(c.get("/healthz") for c in clients))  # connected

        async def client(c: httpx.AsyncClient) -> None:
            while not queue.empty():
                i = queue.get_nowait()
                start = time.perf_counter()
                answer = await c.post("/v1/jobs", json={**body, "name": f"bench-{i}"})
                latencies.append(time.perf_counter() - start)
                assert answer.status_code == 201, answer.text

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in clients))
        return latencies, time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU of the server process and its children (uvicorn workers), from
    /proc: on a shared machine the CPU a request costs is steadier than wall-clock rates."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid, *(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    for one in pids:
        fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_once(
    url: str, tmp: Path, app: str, body: dict, args: argparse.Namespace, workers: int = 1
) -> tuple[list[float], float, int, float]:
    """(latencies, wall seconds, "broker refused" lines, server CPU ms per request)."""
    log = tmp / f"{app.split(':')[0].replace('.', '_')}.log"
    log.write_bytes(b"")
    with api_server(url, tmp, app, workers, log) as (base, key):
        try:
            asyncio.run(post_many(base, key, body, 20, 10))  # warm-up
        except httpx.HTTPError:
            print(f"{app} did not answer; its log ends:\n{log.read_text()[-3000:]}")
            raise
        pid = api_server.pid  # type: ignore[attr-defined]
        cpu = server_cpu_seconds(pid)
        try:
            latencies, wall = asyncio.run(
                post_many(base, key, body, args.requests, args.concurrency)
            )
        except httpx.HTTPError:
            print(f"{app} stopped answering; its log ends:\n{log.read_text()[-3000:]}")
            raise
        cpu_ms = (server_cpu_seconds(pid) - cpu) * 1000 / args.requests
    return latencies, wall, log.read_text(errors="replace").count("broker refused"), cpu_ms


def summary(label: str, latencies: list[float], wall: float, requests: int) -> tuple[str, float]:
    ms = sorted(x * 1000 for x in latencies)
    rate = requests / wall
    return (
        f"  {label:<22} median {statistics.median(ms):7.1f} ms   p99 "
        f"{percentile(ms, 0.99):7.1f} ms   p99/median {percentile(ms, 0.99) / statistics.median(ms):4.1f}"
        f"   {rate:6.1f} req/s"
    ), rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="tuneyard api processes")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also serve tuneyard without validation, and without validation or middleware",
    )
    args = parser.parse_args()
    import redis

    print(
        f"POST /v1/jobs on PostgreSQL, {args.concurrency} concurrent clients, "
        f"{args.requests} requests per run, {os.cpu_count()} CPUs"
    )
    variants = VARIANTS if args.variants else {}
    refused_total, ratios, cpu_ratios = 0, [], []
    variant_ratios: dict[str, list[float]] = {label: [] for label in variants}
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp, pg_database() as url:
            body = {"recipe": write_assets(Path(tmp))}
            floor = run_once(url, Path(tmp), "bench_api_floor:app", body, args)
            ours = run_once(url, Path(tmp), "api.main:app", body, args, args.workers)
            others = {
                label: run_once(url, Path(tmp), app, body, args, args.workers)
                for label, app in variants.items()
            }
            redis.Redis.from_url(REDIS_URL).flushdb()
        floor_line, floor_rate = summary("floor app (1 process)", floor[0], floor[1], args.requests)
        ours_line, ours_rate = summary(
            f"tuneyard api ({args.workers} proc)", ours[0], ours[1], args.requests
        )
        refused_total += ours[2]
        ratios.append(ours_rate / floor_rate)
        cpu_ratios.append(floor[3] / ours[3])
        print(
            f"run {run + 1}:\n{floor_line}   server CPU {floor[3]:.1f} ms/req\n{ours_line}"
            f"   server CPU {ours[3]:.1f} ms/req\n  tuneyard/floor: throughput "
            f"{ratios[-1]:.2f}x, CPU-bound rate (floor CPU / tuneyard CPU) "
            f"{cpu_ratios[-1]:.2f}x   'broker refused' at submit: {ours[2]}"
        )
        for label, other in others.items():
            line, rate = summary(label, other[0], other[1], args.requests)
            variant_ratios[label].append(rate / floor_rate)
            print(
                f"{line}   server CPU {other[3]:.1f} ms/req   "
                f"/floor: {variant_ratios[label][-1]:.2f}x"
            )
    if args.runs > 1:
        print(
            f"{args.runs} runs: median throughput ratio {statistics.median(ratios):.2f}x, "
            f"median CPU ratio {statistics.median(cpu_ratios):.2f}x, "
            f"'broker refused' in all runs: {refused_total}"
        )
        for label, values in variant_ratios.items():
            print(f"  {label}: median throughput ratio {statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
