"""Two-rank gloo test harness shared by the TP/FSDP and EP checks.

The test side (`assert_cases_pass_on_two_ranks`) starts two plain Python processes running
a worker script and asserts that every case passed on both ranks; the worker side
(`run_cases`) joins the process group, runs each case name through `run_case` and writes
one line per case (with the traceback indented on failure) for the test to show.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_cases_pass_on_two_ranks(worker: Path, cases: list[str], tmp_path: Path) -> None:
    out, port = tmp_path / "result", str(_free_port())
    paths = os.pathsep.join([str(ROOT), str(worker.parent), str(ROOT / "tests")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": paths}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), "2", port, str(out), *cases], env=env, cwd=ROOT
        )
        for rank in range(2)
    ]
    for proc in procs:
        proc.wait(timeout=240)
    for rank in range(2):
        lines = (tmp_path / f"result.{rank}").read_text().splitlines()
        results = [line for line in lines if not line.startswith("    ")]
        assert [r.split()[0] for r in results] == cases, lines
        failed = [line for line in lines if " FAILED " in line or line.startswith("    ")]
        assert not failed, f"rank {rank}:\n" + "\n".join(lines)


def run_cases(run_case: Callable[[str], None]) -> None:
    """Worker side: argv is `rank world port out_path case...`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world, port, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    lines = []
    for case in sys.argv[5:]:
        try:
            run_case(case)
            lines.append(f"{case} ok")
        except Exception:  # noqa: BLE001 - the failure is written for the test to show
            lines.append(f"{case} FAILED " + traceback.format_exc().replace("\n", "\n    "))
    with open(f"{out_path}.{rank}", "w") as f:
        f.write("\n".join(lines))
    dist.destroy_process_group()
