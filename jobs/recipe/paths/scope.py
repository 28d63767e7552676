"""Which run directories a recipe may reach: the caller's project, as a `JobScope`.

Run directories are `<runs_dir>/<job id>` and hold every project's checkpoints side by side,
inside the checkpoint roots. Validation cannot read the database, so the server hands
`validate_job` a `JobScope` for the caller's project: its name, `owns_job(id)`, and where a
job keeps its checkpoints when its recipe moved them (`checkpoint_dir_of`). With a scope, a
path inside the runs directory must lie under the run of one of the project's jobs
(`confinement_errors`), and `restore_from: {job: <id>, step: N}` resolves to that job's
`step_<N>` checkpoint (the one its `LATEST` names when no step is given): the layout the
trainer's checkpoint manager writes. Without a scope (`tuneyard validate`, the trainer
re-checking a stored recipe) paths are only checked against the roots and `{job: ...}` is
refused, since only the server knows whose job an id is.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobs.recipe.errors import FieldError
from jobs.recipe.paths.roots import read_bounded

CHECKPOINTS_DIR = "checkpoints"  # <run dir>/checkpoints unless checkpoint.checkpoint_dir moves it
LATEST_FILE = "LATEST"  # one line: the name of the newest complete step directory
STEP_DIR = re.compile(r"^step_([0-9]+)$")
LATEST_CAP = 256
SERVER_FIX = (
    "naming a job needs the server, which knows this project's jobs: submit with "
    "`tuneyard submit` (POST /v1/jobs), or give restore_from: {path: <checkpoint directory>}"
)


def _no_checkpoint_dir(job_id: str) -> str | None:
    return None


@dataclass(frozen=True)
class JobScope:
    """The caller's project as validation sees it; the API builds it from the database."""

    project: str
    owns_job: Callable[[str], bool]  # True only for the exact id of one of the project's jobs
    # The job's own `checkpoint.checkpoint_dir`, or None when it kept the default
    checkpoint_dir_of: Callable[[str], str | None] = _no_checkpoint_dir


def run_dir_of(runs_dir: Path, job_id: str) -> Path:
    """Where the worker runs a job (the same rule `worker.tasks` applies)."""
    return runs_dir / job_id


def checkpoints_of(runs_dir: Path, job_id: str, scope: JobScope) -> Path:
    own = scope.checkpoint_dir_of(job_id)
    return Path(own) if own else run_dir_of(runs_dir, job_id) / CHECKPOINTS_DIR


def _run_under(path: str, runs: str) -> str | None:
    """The run directory name `path` lies in ('' for the runs dir itself), None if outside
    (absolute, normalized paths as text)."""
    if path == runs:
        return ""
    prefix = runs if runs.endswith("/") else runs + "/"
    return path[len(prefix) :].split("/", 1)[0] if path.startswith(prefix) else None


def confinement_errors(
    path: Path, loc: str, runs_dir: Path, scope: JobScope | None
) -> list[FieldError]:
    """With a scope, a path in the runs dir (as written or after symlinks) must lie in the
    run of one of the project's jobs."""
    if scope is None:
        return []
    lexical_runs = os.path.normpath(os.path.abspath(os.path.expanduser(runs_dir)))
    text = os.fspath(path)
    pairs = (
        (os.path.normpath(text), lexical_runs),
        (os.path.realpath(text), os.path.realpath(lexical_runs)),
    )
    fix = f"use the run directory of a job of project {scope.project}, or the checkpoint roots"
    for candidate, runs in pairs:
        run = _run_under(candidate, runs)
        if run == "":
            return [FieldError(loc, f"{str(path)!r} is the runs directory of every project", fix)]
        if run is None:
            continue
        if not scope.owns_job(run):
            msg = f"{str(path)!r} is in the run of a job that is not in project {scope.project}"
            return [FieldError(loc, msg, fix)]
    return []


def _step_names(root: Path) -> list[str]:
    found = (p.name for p in itertools.islice(root.glob("step_*"), 10_000) if p.is_dir())
    return sorted((n for n in found if STEP_DIR.match(n)), key=lambda n: int(n[5:]))


def _latest(root: Path, job: str, roots: list[Path]) -> tuple[Path | None, list[FieldError]]:
    loc, pointer = "restore_from.job", root / LATEST_FILE
    if not os.path.lexists(pointer):
        fix = f"give restore_from.step, or wait until job {job} saves a checkpoint"
        return None, [FieldError(loc, f"job {job} has no checkpoint yet ({pointer})", fix)]
    data, errors = read_bounded(pointer, loc, roots, LATEST_CAP)
    name = data.decode("utf-8", "replace").strip() if data is not None else ""
    if data is not None and not STEP_DIR.match(name):
        fix = "give restore_from.step"
        errors = [FieldError(loc, f"{pointer} names {name[:80]!r}, not a step directory", fix)]
    return (root / name, []) if not errors else (None, errors)


def resolve_restore_job(
    job: str, step: int | None, runs_dir: Path, roots: list[Path], scope: JobScope | None
) -> tuple[Path | None, list[FieldError]]:
    """`restore_from: {job, step}` -> that job's checkpoint directory (its LATEST without a
    step). The path still goes through the root and confinement checks after this."""
    loc = "restore_from.job"
    if scope is None:
        return None, [FieldError(loc, "names a job, which only the server can resolve", SERVER_FIX)]
    if not scope.owns_job(job):
        fix = "give the id of a job of this project (tuneyard jobs list, GET /v1/jobs)"
        return None, [FieldError(loc, f"no job {job} in project {scope.project}", fix)]
    root = checkpoints_of(runs_dir, job, scope)
    if step is None:
        return _latest(root, job, roots)
    found = root / f"step_{step}"
    if found.is_dir():
        return found, []
    names = _step_names(root)
    fix = f"use one of {', '.join(names[-10:])}" if names else "it has saved no checkpoint yet"
    msg = f"job {job} has no checkpoint at step {step}"
    return None, [FieldError("restore_from.step", msg, fix)]
