"""This rank's failure record: `<run_dir>/failures/rank-<N>.json`, written when the rank fails.

Only rank 0 writes events, and when any rank fails torchrun sends SIGTERM to the others, so
rank 0 may die before it can say why the run ended. Each failing rank therefore writes its
own `RankFailure` (see `jobs.recipe.exit_codes`) first in its failure path: to a temporary
name, fsynced, then renamed, so the worker reads a whole record or none. `sigterm_deferred`
holds a SIGTERM that arrives while a rank reports its failure until the report is written;
a rank that is stopped without a failure of its own writes nothing, so a peer's real cause
is never hidden behind a "terminated".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from jobs.recipe.exit_codes import FAILURES_DIR, ExitCode, RankFailure, failure_record_name


def rank_failure(code: ExitCode, message: str, fix: str, step: int) -> RankFailure:
    """This rank's failure now, placed by torchrun's environment (rank 0 of 1 without it)."""
    attempt = os.environ.get("TUNEYARD_ATTEMPT", "")
    return RankFailure(
        rank=int(os.environ.get("RANK", "0")),
        exit_code=int(code),
        message=message,
        fix=fix,
        step=step,
        timestamp=time.time(),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        attempt=int(attempt) if attempt.isdigit() else None,
    )


def write_failure_record(run_dir: Path, failure: RankFailure) -> Path | None:
    """Publish `failure` atomically; None (and a line on stderr) when it cannot be written."""
    directory = run_dir / FAILURES_DIR
    path = directory / failure_record_name(failure.rank)
    staging = directory / f".{path.name}.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(failure.to_json()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
        _fsync_directory(directory)
    except OSError as exc:
        print(f"[rank {failure.rank}] cannot write {path}: {exc}", file=sys.stderr, flush=True)
        return None
    return path


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; a filesystem that cannot fsync a directory still has it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold SIGTERM until the block ends, then let it act as it would have.

    Blocking the signal in this thread would not do: the kernel hands a process-directed
    signal to any thread that does not block it (gloo and data loader threads among them),
    and with the default action the whole process dies. A Python handler runs in the main
    thread only, so elsewhere the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(signal.SIGTERM)
