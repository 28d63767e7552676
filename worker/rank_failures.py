"""The ranks' failure records in a run directory: cleared before a launch, read after it.

Every failing rank writes `<run_dir>/failures/rank-<N>.json` (see `trainer.failure_record`),
because rank 0, the only writer of events, may be stopped by torchrun before it can report a
failure another rank saw. The worker clears the folder before it starts an attempt, reads the
records once torchrun has exited (records of another attempt are skipped), and appends a
`failed` event for a cause rank 0 did not report, so the job's events show it too.

The run directory is written by code a recipe controls, so reading never trusts it: the
folder and each file are opened without following symlinks, only regular files of the
expected names are read, at most `RECORD_BYTES_MAX` bytes each and `MAX_RECORDS` files in
all, and anything that is not a valid record is skipped, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from itertools import islice
from pathlib import Path
from typing import Any

from jobs.recipe.exit_codes import FAILURES_DIR, RECORD_BYTES_MAX, RECORD_NAME, RankFailure

log = logging.getLogger("tuneyard.worker")
MAX_RECORDS = 4096  # directory entries looked at; enough ranks to find the first cause
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO must not block the read
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK


def clear_failure_records(run_dir: Path) -> None:
    """Remove the records an earlier attempt left (a link of that name is removed, not
    followed: `shutil.rmtree` does not follow links inside the folder either)."""
    path = run_dir / FAILURES_DIR
    try:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
    except OSError as exc:  # records of another attempt are skipped when read anyway
        log.warning("cannot clear %s: %s", path, exc)


def read_failure_records(run_dir: Path, attempt: int) -> list[RankFailure]:
    """The valid records of `attempt` in `run_dir`, one per rank, in rank order."""
    try:
        dir_fd = os.open(run_dir / FAILURES_DIR, _DIR_FLAGS)
    except OSError:
        return []  # no rank failed (or the name is not a real folder)
    try:
        with os.scandir(dir_fd) as entries:
            names = [e.name for e in islice(entries, MAX_RECORDS) if RECORD_NAME.fullmatch(e.name)]
        records = (_read_record(dir_fd, name) for name in names)
        found = [r for r in records if r is not None and r.attempt == attempt]
    except OSError as exc:
        log.warning("cannot read %s: %s", run_dir / FAILURES_DIR, exc)
        return []
    finally:
        os.close(dir_fd)
    return sorted(found, key=lambda record: record.rank)


def _read_record(dir_fd: int, name: str) -> RankFailure | None:
    """The record in file `name`, when it is a small regular file naming its own rank."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, RECORD_BYTES_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > RECORD_BYTES_MAX:
        return None
    try:
        record = RankFailure.from_json(json.loads(raw))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond reason
        return None
    matches = record is not None and name == f"rank-{record.rank}.json"
    return record if matches else None


def append_event(events_path: Path, record: dict[str, Any]) -> bool:
    """Append one event line as the trainer would (its ranks have all exited by now); False
    when the file cannot take it (not a regular file, or a link, which is never followed).

    A line rank 0 was killed in the middle of is ended first, so the event stays a line of
    its own: the half line is reported as unreadable, this one is ingested.
    """
    line = json.dumps(record).encode() + b"\n"
    try:
        fd = os.open(events_path, _APPEND_FLAGS, 0o644)
    except OSError as exc:
        log.warning("cannot append to %s: %s", events_path, exc)
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return False
        size = info.st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    except OSError as exc:
        log.warning("cannot append to %s: %s", events_path, exc)
        return False
    finally:
        os.close(fd)
    return True
