"""Expert parallelism (ep_size 2) through the trainer's `parallelize` matches one process in
the layouts beyond fp32 with ep == dp, for every MoE family: bf16 models (their routers,
and gpt-oss's attention sinks, kept fp32) on 2 ranks, and ep 2 over 4 data-parallel ranks
(each expert held by 2 ranks, FSDP2-sharded over them). `_ep_layout_worker.py` runs on
plain gloo processes and says what it checks and why the bf16 tolerances are what they are.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("_ep_layout_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_cases_pass(world: int, cases: list[str], tmp_path: Path) -> None:
    """Run the worker on `world` gloo ranks; every rank must report every case ok."""
    out, port = tmp_path / "result", str(_free_port())
    paths = os.pathsep.join([str(ROOT), str(WORKER.parent), str(ROOT / "tests")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": paths}
    command = [sys.executable, str(WORKER)]
    procs = [
        subprocess.Popen([*command, str(rank), str(world), port, str(out), *cases], env=env)
        for rank in range(world)
    ]
    for proc in procs:
        proc.wait(timeout=300)
    for rank in range(world):
        lines = (tmp_path / f"result.{rank}").read_text().splitlines()
        assert [line.split()[0] for line in lines if not line.startswith("    ")] == cases, lines
        assert not any(" FAILED " in line for line in lines), f"rank {rank}:\n" + "\n".join(lines)


FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "gpt_oss"]


def test_bf16_expert_parallel_matches_one_process(tmp_path) -> None:
    """ep == dp == 2, bf16 with each family's fp32 router (and gpt-oss's fp32 sinks)."""
    assert_cases_pass(2, [f"{family}:bfloat16" for family in FAMILIES], tmp_path)


def test_ep_over_half_the_dp_ranks_matches_one_process(tmp_path) -> None:
    """ep 2 over dp 4: every family in fp32, and Qwen3-MoE in bf16 too."""
    cases = [f"{family}:float32" for family in FAMILIES] + ["qwen3_moe:bfloat16"]
    assert_cases_pass(4, cases, tmp_path)
