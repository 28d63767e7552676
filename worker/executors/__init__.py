"""Where an attempt's processes run: this host (`local`, torchrun as a child) or SLURM.

`TUNEYARD_EXECUTOR` (`local` by default, or `slurm`) picks it per worker. Both give the
supervisor the same handle: `poll()` (None while the attempt runs, then its exit code),
the two output streams for the log pump, `started()` (the processes exist: a SLURM job may
wait in its queue first), `signal_stop(sig)` for cancel and pause (SIGTERM first, SIGKILL
after the grace period), `cleanup()` once it ended, and `outcome()` for ends an exit code
cannot express (a SLURM node failure, a job killed for memory). The lease, fencing and
settling stay in the supervisor, whatever runs the processes.
"""

from __future__ import annotations

from pathlib import Path

from worker import proctree
from worker.config import WorkerConfig
from worker.executors.base import AttemptHandle, LaunchUnavailable
from worker.executors.local import LocalAttempt
from worker.executors.slurm import SlurmAttempt, cancel_older_attempts
from worker.launcher import LaunchSpec, start_attempt

__all__ = ["AttemptHandle", "LaunchUnavailable", "start", "stop_older_attempts"]


def stop_older_attempts(spec: LaunchSpec, config: WorkerConfig) -> None:
    """Nothing of an earlier attempt of this job may keep running beside the new one."""
    if config.executor == "slurm":
        cancel_older_attempts(spec.job_id, spec.attempt)
    else:
        proctree.stop_older_attempts(spec.job_id, spec.attempt)


def start(spec: LaunchSpec, run_dir: Path, config: WorkerConfig) -> AttemptHandle:
    """Start the attempt with the worker's executor (raises OSError when it cannot,
    `LaunchUnavailable` when asking again later may work)."""
    if config.executor == "slurm":
        return SlurmAttempt.submit(spec, run_dir, config)
    return LocalAttempt(spec, start_attempt(spec, cwd=run_dir))
