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

import signal
import subprocess
from pathlib import Path
from typing import IO, Protocol

from jobs.orchestration.policy import Outcome
from worker import proctree
from worker.config import WorkerConfig
from worker.launcher import LaunchSpec, build_command, start_attempt


class LaunchUnavailable(OSError):
    """The scheduler could not take the attempt for now (SLURM's controller down or busy):
    worth asking again, unlike a refusal of the job itself."""


class AttemptHandle(Protocol):
    stdout: IO[bytes]
    stderr: IO[bytes]

    def poll(self) -> int | None: ...
    def started(self) -> bool: ...
    def describe(self) -> dict[str, str]: ...
    def signal_stop(self, sig: signal.Signals) -> None: ...
    def cleanup(self) -> None: ...
    def outcome(self) -> Outcome | None: ...


class LocalAttempt:
    """torchrun as a child process in its own session, its ranks found by their run tag."""

    def __init__(self, spec: LaunchSpec, proc: subprocess.Popen[bytes]) -> None:
        self.spec, self.proc = spec, proc
        self.stdout, self.stderr = proc.stdout, proc.stderr

    def poll(self) -> int | None:
        return self.proc.poll()

    def started(self) -> bool:
        return True

    def describe(self) -> dict[str, str]:
        return {"command": " ".join(build_command(self.spec))}

    def signal_stop(self, sig: signal.Signals) -> None:
        spec = self.spec
        proctree.signal_pids(proctree.tagged_pids(spec.job_id, spec.attempt, spec.node_rank), sig)

    def cleanup(self) -> None:
        # ranks of a killed torchrun may outlive it: nothing of this attempt may remain
        proctree.stop_job_processes(self.spec.job_id, self.spec.attempt, 2.0, self.spec.node_rank)

    def outcome(self) -> Outcome | None:
        return None


def stop_older_attempts(spec: LaunchSpec, config: WorkerConfig) -> None:
    """Nothing of an earlier attempt of this job may keep running beside the new one."""
    if config.executor == "slurm":
        from worker.slurm import cancel_older_attempts

        cancel_older_attempts(spec.job_id, spec.attempt)
    else:
        proctree.stop_older_attempts(spec.job_id, spec.attempt)


def start(spec: LaunchSpec, run_dir: Path, config: WorkerConfig) -> AttemptHandle:
    """Start the attempt with the worker's executor (raises OSError when it cannot,
    `LaunchUnavailable` when asking again later may work)."""
    if config.executor == "slurm":
        from worker.slurm import SlurmAttempt

        return SlurmAttempt.submit(spec, run_dir, config)
    return LocalAttempt(spec, start_attempt(spec, cwd=run_dir))
