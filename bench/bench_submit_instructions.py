"""Benchmark: CPU instructions per `POST /v1/jobs`, tuneyard against its floor, under callgrind.

Wall-clock rates on a shared 2-core machine move by half from one minute to the next;
instruction counts do not. Each app (the floor, `bench_api_floor.py`, then
`api.main:create_app`) runs in one process under `valgrind --tool=callgrind` on a throwaway
PostgreSQL database with the broker on Redis DB 1: warm-up submits, then the counters are
zeroed and `--requests` sequential submits are counted (the in-process httpx client over
ASGI included, the same for both). Prints millions of instructions per submit for each
and the ratio floor / tuneyard: the throughput a one-core-bound API would reach relative
to the floor if instructions were all that mattered. Needs valgrind (Debian's package).
Run: `python bench/bench_submit_instructions.py [--requests 60] [--warmup 40]`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


async def _submits(app: object, key: str, body: dict, warmup: int, requests: int) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(
            transport=transport, base_url="http://bench", headers=headers
        ) as client:
            for i in range(warmup):
                answer = await client.post("/v1/jobs", json={**body, "name": f"warm-{i}"})
                assert answer.status_code == 201, answer.text
            pid = str(os.getpid())
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=False)
            for i in range(requests):
                await client.post("/v1/jobs", json={**body, "name": f"bench-{i}"})
            subprocess.run(
                ["callgrind_control", "-d", "measured", pid], capture_output=True, check=False
            )


def child(app_path: str, warmup: int, requests: int) -> None:
    """Inside valgrind: one app, its database, its submits."""
    import bench_api_submit as bench

    with tempfile.TemporaryDirectory() as tmp, bench.pg_database() as url:
        body = {"recipe": bench.write_assets(Path(tmp))}
        env, key = bench.prepared(url, Path(tmp))
        os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
        os.chdir(tmp)
        module, _, attr = app_path.partition(":")
        app = getattr(importlib.import_module(module), attr)
        app = app() if attr == "create_app" else app
        asyncio.run(_submits(app, key, body, warmup, requests))
        import redis

        redis.Redis.from_url(bench.REDIS_URL).flushdb()


def counted(app_path: str, warmup: int, requests: int, out: Path) -> float:
    """Millions of instructions per submit of `app_path`."""
    stem = out / app_path.replace(":", "_").replace(".", "_")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={stem}.out",
        os.path.realpath(sys.executable),
        __file__,
        "--child",
        app_path,
        "--warmup",
        str(warmup),
        "--requests",
        str(requests),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    dumps = sorted(out.glob(f"{stem.name}.out.*"))
    if done.returncode != 0 or not dumps:
        raise SystemExit(f"{app_path} under valgrind failed:\n{done.stderr[-3000:]}")
    for line in dumps[0].read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1]) / requests / 1e6
    raise SystemExit(f"no instruction total in {dumps[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.warmup, args.requests)
        return
    with tempfile.TemporaryDirectory() as out:
        floor = counted("bench_api_floor:app", args.warmup, args.requests, Path(out))
        ours = counted("api.main:create_app", args.warmup, args.requests, Path(out))
    print(
        f"POST /v1/jobs, {args.requests} sequential submits after {args.warmup} warm-up, "
        "in process (httpx over ASGI), callgrind"
    )
    print(f"  floor app     {floor:6.2f} M instructions per submit")
    print(f"  tuneyard api  {ours:6.2f} M instructions per submit")
    print(f"  floor / tuneyard: {floor / ours:.2f}x")


if __name__ == "__main__":
    main()
