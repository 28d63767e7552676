"""A stand-in for `-m trainer` that keeps the run-directory contract without torch.

It lets the worker's failure catalogue be tested in a second instead of a minute: it
reads `recipe.json` (`fake.steps`, `fake.step_seconds`, `fake.exit_code`, `fake.fail_at`,
`fake.crash_attempts`), resumes from `checkpoints/LATEST` (else from `restore_from.path`),
appends train records and lifecycle events, checkpoints every `fake.ckpt_every` steps and
saves and exits 75 on SIGTERM, like the real trainer. Only rank 0 writes files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

stop_requested = False


def _on_sigterm(signum, frame):
    global stop_requested
    stop_requested = True


def _append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def _save(run_dir: Path, step: int, events: Path) -> None:
    ckpt = run_dir / "checkpoints" / f"step_{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "state.json").write_text(json.dumps({"step": step}))
    (run_dir / "checkpoints" / "LATEST").write_text(f"step_{step}")
    _append(
        events,
        {
            "event": "checkpoint_saved",
            "step": step,
            "path": str(ckpt),
            "size_bytes": 10,
            "metrics": {"loss": 1.0 / step},
            "timestamp": time.time(),
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    run_dir = Path(args.run_dir)
    recipe = yaml.safe_load(Path(args.recipe).read_text()) or {}
    fake = recipe.get("fake", {})
    rank0 = os.environ.get("RANK", "0") == "0"
    metrics, events = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
    latest = run_dir / "checkpoints" / "LATEST"
    start = int(latest.read_text().split("_")[1]) if latest.exists() else 0
    restore = (recipe.get("restore_from") or {}).get("path")
    if not start and restore:  # a checkpoint directory, as the worker hands it over
        start = json.loads((Path(restore) / "state.json").read_text())["step"]
    attempt = int(os.environ.get("TUNEYARD_ATTEMPT", "1"))
    if rank0:
        _append(
            events,
            {
                "event": "resumed" if start else "started",
                "step": start,
                "timestamp": time.time(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            },
        )
    if attempt <= int(fake.get("crash_attempts", 0)):
        time.sleep(float(fake.get("crash_after_s", 0.2)))
        return 1
    for step in range(start + 1, int(fake.get("steps", 10)) + 1):
        time.sleep(float(fake.get("step_seconds", 0.05)))
        if fake.get("fail_at") == step:
            code = int(fake.get("exit_code", 4))
            if rank0:
                _append(
                    events,
                    {
                        "event": "failed",
                        "step": step,
                        "code": "nan_loss",
                        "exit_code": code,
                        "message": f"loss is nan at step {step}",
                        "timestamp": time.time(),
                    },
                )
            return code
        if rank0:
            _append(
                metrics,
                {
                    "kind": "train",
                    "step": step,
                    "epoch": 0,
                    "loss": 1.0 / step,
                    "grad_norm": 1.0,
                    "lr": 1e-3,
                    "mem": 0.1,
                    "tps": 100.0,
                    "tps_per_rank": 100.0,
                    "mfu": 0.01,
                    "num_tokens": 64,
                    "timestamp": time.time(),
                },
            )
            if step % int(fake.get("ckpt_every", 5)) == 0:
                _save(run_dir, step, events)
        if stop_requested:
            if rank0:
                _save(run_dir, step, events)
                _append(events, {"event": "preempted", "step": step, "timestamp": time.time()})
            return 75
    if rank0:
        _append(
            events,
            {"event": "finished", "step": int(fake.get("steps", 10)), "timestamp": time.time()},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
