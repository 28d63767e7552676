"""`python -m trainer.launch`: torchrun as the worker starts it. A SIGTERM (a pause, a cancel,
a preemption) reaches the rank, and torchrun's own ending is one line, not a traceback.
(A run that ends by itself: every job of tests/integration/worker/test_real_trainer.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RANK = """\
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("rank stopped", flush=True), sys.exit(0)))
print("rank up", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _launch(tmp_path: Path, seconds: float) -> subprocess.Popen[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    argv = [sys.executable, "-m", "trainer.launch", "--standalone", "--nnodes", "1",
            "--nproc_per_node", "1", "--max-restarts", "0", str(script), str(seconds)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


def test_a_sigterm_ends_torchrun_with_one_line(tmp_path: Path) -> None:
    proc = _launch(tmp_path, 120)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "rank up" not in proc.stdout.readline():
        pass
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "rank stopped" in out
    assert "Traceback" not in err and "SignalException" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("[tuneyard]")]
    assert ours == ["[tuneyard] torchrun stopped by SIGTERM: every rank was asked to stop"]
