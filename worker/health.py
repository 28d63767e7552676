"""Liveness and readiness of the worker and scheduler processes, for container probes.

Neither process holds a port, so each one's loop leaves a small JSON file behind on every
pass (`mark`): when it ran and whether its last database write succeeded. `check` reads it:
*alive* means the loop ran within `max_age` seconds (a hung loop restarts the pod), *ready*
also needs the last pass to have reached the database. Liveness deliberately ignores the
database: restarting every worker because PostgreSQL is down would only lose their running
jobs. The files live in `TUNEYARD_HEALTH_DIR` (default `<TUNEYARD_HOME>/health`), one per
role, written atomically so a probe never reads half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROLES = ("worker", "scheduler")


def health_dir() -> Path:
    explicit = os.environ.get("TUNEYARD_HEALTH_DIR")
    if explicit:
        return Path(explicit)
    from jobs.recipe.settings import RecipeSettings

    return RecipeSettings().home / "health"


def mark(role: str, ok: bool, detail: str = "", directory: Path | None = None) -> None:
    """Record one pass of `role`'s loop; never raises (a probe file must not stop the loop)."""
    directory = directory or health_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"ts": time.time(), "ok": ok, "detail": detail, "pid": os.getpid()})
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{role}.")
        with os.fdopen(fd, "w") as handle:
            handle.write(payload)
        os.replace(tmp, directory / f"{role}.json")
    except OSError:
        pass


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    reason: str


def check(role: str, max_age: float, ready: bool = False, directory: Path | None = None) -> Verdict:
    """Whether `role` is alive (and, with `ready`, connected) as its last mark says."""
    path = (directory or health_dir()) / f"{role}.json"
    try:
        state = json.loads(path.read_text())
        age = time.time() - float(state["ts"])
    except (OSError, ValueError, KeyError, TypeError):
        return Verdict(False, f"no {role} health file at {path}: the {role} loop has not run")
    if age > max_age:
        return Verdict(False, f"{role} loop last ran {age:.0f}s ago (limit {max_age:.0f}s)")
    if ready and not state.get("ok"):
        detail = state.get("detail") or "database unreachable"
        return Verdict(False, f"{role} is alive but not ready: {detail}")
    return Verdict(True, f"{role} ok ({age:.1f}s ago)")
