"""Finding and stopping every process of a job attempt, including torchrun's ranks.

torchrun starts each rank in a session of its own, so signalling torchrun's process group
does not reach the ranks, and a rank whose agent died is re-parented away from the tree.
The launcher therefore tags every process it starts with `TUNEYARD_RUN_TAG=<job>:<attempt>`
in its environment (inherited by the ranks); this module finds processes by that tag
through /proc and stops them: SIGTERM first (the trainer saves and exits), SIGKILL after a
grace period. Linux only, like the rest of the worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

RUN_TAG_ENV = "TUNEYARD_RUN_TAG"
_PROC = Path("/proc")


def run_tag(job_id: str, attempt: int, node: int = 0) -> str:
    return f"{job_id}:{attempt}:{node}"


def _tag_matches(tag: str, job_id: str, attempt: int | None, node: int | None) -> bool:
    parts = tag.split(":")
    if len(parts) != 3 or parts[0] != job_id:
        return False
    if attempt is not None and parts[1] != str(attempt):
        return False
    return node is None or parts[2] == str(node)


def _environ_tag(pid: int) -> str | None:
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # the process ended, or belongs to another user
        return None
    prefix = RUN_TAG_ENV.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _is_zombie(pid: int) -> bool:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def tagged_pids(job_id: str, attempt: int | None = None, node: int | None = None) -> list[int]:
    """Live processes of the job; `attempt` / `node` narrow it (None: any)."""
    found = []
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        tag = _environ_tag(int(entry.name))
        if tag is None or not _tag_matches(tag, job_id, attempt, node):
            continue
        if not _is_zombie(int(entry.name)):
            found.append(int(entry.name))
    return found


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_job_processes(
    job_id: str, attempt: int | None, grace_s: float, node: int | None = None
) -> bool:
    """SIGTERM the job's processes, SIGKILL what is left after `grace_s`. True if none left."""
    signal_pids(tagged_pids(job_id, attempt, node), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not tagged_pids(job_id, attempt, node):
            return True
        time.sleep(0.1)
    for _ in range(20):
        left = tagged_pids(job_id, attempt, node)
        if not left:
            return True
        signal_pids(left, signal.SIGKILL)
        time.sleep(0.1)
    return not tagged_pids(job_id, attempt, node)


def stop_older_attempts(job_id: str, attempt: int, grace_s: float = 2.0) -> list[int]:
    """Kill leftovers of earlier attempts of the job on this machine; returns their pids."""
    stale = [
        pid
        for pid in tagged_pids(job_id)
        if (tag := _environ_tag(pid)) and tag.split(":")[1] != str(attempt)
    ]
    if stale:
        signal_pids(stale, signal.SIGTERM)
        time.sleep(grace_s)
        signal_pids(stale, signal.SIGKILL)
    return stale


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to signal this (child) process when its parent thread dies.

    Called in the child between fork and exec: if the worker is SIGKILLed, torchrun gets
    SIGTERM and stops its ranks instead of training on unsupervised.
    """
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(sig), 0, 0, 0)
