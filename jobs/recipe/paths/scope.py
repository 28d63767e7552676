"""Which checkpoint paths a recipe may reach: the caller's project, as a `JobScope`.

Run directories are `<runs_dir>/<job id>` and hold every project's checkpoints side by side,
inside the checkpoint roots. Validation cannot read the database, so the server hands
`validate_job` a `JobScope` for the caller's project: its name, `owns_job(id)`, and where a
job keeps its checkpoints when its recipe moved them (`checkpoint_dir_of`). With a scope, a
path inside the runs directory must lie under the run of one of the project's jobs
(`confinement_errors`); a checkpoint path a job writes or restores from must be the
project's own (`owner_errors`): the run of one of its jobs or `<root>/projects/<project>/`
of a checkpoint root, decided from the text before anything is looked at and refused with
one answer, so that no answer tells what another project has; a relative `checkpoint_dir`
is kept relative (`run_relative`): the trainer puts it in the job's run directory. A path a
job only reads (a model, a tokenizer, data) may lie anywhere in the data roots except in
another project's part of a checkpoint root (`foreign_project_errors`): projects keep
their checkpoints under `projects/`, apart from whatever else a root holds (datasets that
the data roots share with the checkpoint roots, as the default roots do).
`restore_from: {job: <id>, step: N}` resolves to that job's `step_<N>` checkpoint (the one
its `LATEST` names when no step is given): the layout the trainer's checkpoint manager
writes. Without a scope (`tuneyard validate`, the trainer re-checking a stored recipe)
paths are only checked against the roots and `{job: ...}` is refused, since only the server
knows whose job an id is.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.paths.roots import Roots, lexical_path, read_bounded

CHECKPOINTS_DIR = "checkpoints"  # <run dir>/checkpoints unless checkpoint.checkpoint_dir moves it
LATEST_FILE = "LATEST"  # one line: the name of the newest complete step directory
STEP_DIR = re.compile(r"\Astep_([0-9]+)\Z")
# Each checkpoint root keeps projects' checkpoints in `projects/<project>/`. A project name
# that is one plain path component names that directory; project names are not otherwise
# constrained, so any other name has none.
PROJECTS_DIR = "projects"
PROJECT_DIR = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
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

    @property
    def project_dir(self) -> str | None:
        """The directory the project owns under each checkpoint root (None: it has none)."""
        return self.project if PROJECT_DIR.match(self.project) else None


def run_dir_of(runs_dir: Path, job_id: str) -> Path:
    """Where the worker runs a job (the same rule `worker.tasks` applies)."""
    return runs_dir / job_id


def checkpoints_of(runs_dir: Path, job_id: str, scope: JobScope) -> Path:
    """The job's checkpoints: its own checkpoint_dir (a relative one in its run directory,
    where the trainer puts it) or the run's `checkpoints/`."""
    own = scope.checkpoint_dir_of(job_id)
    return run_dir_of(runs_dir, job_id) / (own or CHECKPOINTS_DIR)


def _first_below(path: str, top: str) -> str | None:
    """The name of the entry of `top` that `path` lies in ('' for `top` itself), None if
    outside (absolute, normalized paths as text): a run in the runs dir, a project's
    directory in a checkpoint root."""
    if path == top:
        return ""
    prefix = top if top.endswith("/") else top + "/"
    return path[len(prefix) :].split("/", 1)[0] if path.startswith(prefix) else None


def runs_roots(runs_dir: Path | Roots) -> Roots:
    """The runs directory as one resolved root (a caller checking several paths resolves
    it once and passes the `Roots`)."""
    return runs_dir if isinstance(runs_dir, Roots) else Roots.of([runs_dir])


def confinement_errors(
    path: Path, loc: str, runs_dir: Path | Roots, scope: JobScope | None, real: str | None = None
) -> list[FieldError]:
    """With a scope, a path in the runs dir (as written or after symlinks) must lie in the
    run of one of the project's jobs. `real`: the path resolved, when the caller has it."""
    if scope is None:
        return []
    runs, text = runs_roots(runs_dir), os.fspath(path)
    pairs = (
        (os.path.normpath(text), runs.lexical[0]),
        (real if real is not None else os.path.realpath(text), runs.real[0]),
    )
    fix = f"use the run directory of a job of project {scope.project}, or the checkpoint roots"
    for candidate, top in pairs:
        run = _first_below(candidate, top)
        if run == "":
            return [
                FieldError(loc, f"{shown(str(path))} is the runs directory of every project", fix)
            ]
        if run is None:
            continue
        if not scope.owns_job(run):
            msg = (
                f"{shown(str(path))} is in the run of a job that is not in project {scope.project}"
            )
            return [FieldError(loc, msg, fix)]
    return []


def _innermost(path: str, roots: tuple[str, ...], runs: str) -> str | None:
    """The innermost of the checkpoint roots and the runs dir that holds `path`."""
    holding = [top for top in (*roots, runs) if _first_below(path, top) is not None]
    return max(holding, key=len) if holding else None


def _project_below(path: str, top: str) -> str | None:
    """The project whose part of checkpoint root `top` holds `path` (`top/projects/<name>`),
    '' for `top/projects` itself, None when `path` is not in that part of the root."""
    if _first_below(path, top) != PROJECTS_DIR:
        return None
    return _first_below(path, os.path.join(top, PROJECTS_DIR))


def _owns(path: str, roots: tuple[str, ...], runs: str, scope: JobScope) -> bool | None:
    """Whether `path` is the project's own: in the run of one of its jobs, or in its part of
    the innermost checkpoint root holding it (so a root nested in another gives nothing
    away). None: no root holds it."""
    top = _innermost(path, roots, runs)
    if top is None:
        return None
    if top == runs:
        entry = _first_below(path, top)
        return bool(entry) and scope.owns_job(entry)
    project = _project_below(path, top)
    return bool(project) and project == scope.project_dir


def _foreign(path: str, roots: tuple[str, ...], runs: str, scope: JobScope) -> bool:
    """Whether `path` lies in another project's part of a checkpoint root (the runs dir has
    its own rule, `confinement_errors`)."""
    top = _innermost(path, roots, runs)
    if top is None or top == runs:
        return False
    project = _project_below(path, top)
    return project is not None and project != scope.project_dir


def own_places_fix(roots: Roots | list[Path], runs_dir: Path | Roots, scope: JobScope) -> str:
    """Where a job of the project may keep and restore checkpoints, as a fix."""
    runs = runs_roots(runs_dir).lexical[0]
    lexical = Roots.of(roots).lexical
    tops = [top for top in lexical if top != runs] if scope.project_dir else []
    under = "".join(
        f" or under {top}/{PROJECTS_DIR}/{scope.project_dir}/" for top in dict.fromkeys(tops)
    )
    return (
        f"keep checkpoints in the job's run directory (a relative checkpoint_dir such as "
        f"checkpoints/){under}; restore from there or with restore_from: {{job: <id>}} of a "
        f"job of project {scope.project}"
    )


def owner_errors(
    value: object,
    loc: str,
    roots: Roots | list[Path],
    runs_dir: Path | Roots,
    scope: JobScope | None,
) -> list[FieldError]:
    """With a scope, a checkpoint path inside the roots must be the project's own, as written
    and after symlinks. A path whose text names another project's part is refused before
    anything is looked at; only a path whose text is the project's own is resolved (through
    the links in it). Every refusal reads the same, so no answer tells what exists where.
    Paths outside the roots are left to the roots check."""
    if scope is None or not isinstance(value, str) or not value.strip() or "\x00" in value:
        return []
    tops, runs, path = Roots.of(roots), runs_roots(runs_dir), lexical_path(value)
    owned = _owns(path, tops.lexical, runs.lexical[0], scope)
    if owned:
        owned = _owns(os.path.realpath(path), tops.real, runs.real[0], scope)
    if owned is not False:
        return []
    msg = f"{shown(value)} is outside project {scope.project}'s checkpoint directories"
    return [FieldError(loc, msg, own_places_fix(tops, runs, scope))]


def foreign_project_errors(
    value: object,
    loc: str,
    roots: Roots | list[Path],
    runs_dir: Path | Roots,
    scope: JobScope | None,
) -> list[FieldError]:
    """With a scope, a path a job reads may not lie in another project's part of a
    checkpoint root, as written or after symlinks; refused with one answer whether or not
    it exists, before anything in it is looked at."""
    if scope is None or not isinstance(value, str) or not value.strip() or "\x00" in value:
        return []
    tops, runs, path = Roots.of(roots), runs_roots(runs_dir), lexical_path(value)
    foreign = _foreign(path, tops.lexical, runs.lexical[0], scope)
    if not foreign:
        foreign = _foreign(os.path.realpath(path), tops.real, runs.real[0], scope)
    if not foreign:
        return []
    msg = f"{shown(value)} is in another project's checkpoint directory"
    fix = (
        f"read models and data from the data roots outside the projects' parts, or from "
        f"project {scope.project}'s own checkpoints"
    )
    return [FieldError(loc, msg, fix)]


def run_relative(
    value: str, loc: str, roots: list[Path], runs_dir: Path, scope: JobScope
) -> tuple[str | None, list[FieldError]]:
    """A relative path a job writes, kept relative and normalized: the trainer puts it in
    the job's run directory (`checkpoints/` is where checkpoints go by default). It may not
    climb out with '..'."""
    normal = os.path.normpath(value)
    if normal == ".." or normal.startswith("../"):
        msg = f"{shown(value)} climbs out of the job's run directory with '..'"
        return None, [FieldError(loc, msg, own_places_fix(roots, runs_dir, scope))]
    return normal, []


def is_relative_path(value: object) -> bool:
    """A non-empty path string that is relative (after `~` expansion)."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        return False
    return not os.path.isabs(os.path.expanduser(value))


def _step_names(root: Path) -> list[str]:
    found = (p.name for p in itertools.islice(root.glob("step_*"), 10_000) if p.is_dir())
    return sorted((n for n in found if STEP_DIR.match(n)), key=lambda n: int(n[5:]))


def _latest(
    root: Path, job: str, roots: Roots | list[Path]
) -> tuple[Path | None, list[FieldError]]:
    loc, pointer = "restore_from.job", root / LATEST_FILE
    if not os.path.lexists(pointer):
        fix = f"give restore_from.step, or wait until job {job} saves a checkpoint"
        return None, [
            FieldError(loc, f"job {job} has no checkpoint yet ({shown(str(pointer))})", fix)
        ]
    data, errors = read_bounded(pointer, loc, roots, LATEST_CAP)
    name = data.decode("utf-8", "replace").strip() if data is not None else ""
    if data is not None and not STEP_DIR.match(name):
        fix = "give restore_from.step"
        errors = [
            FieldError(
                loc, f"{shown(str(pointer))} names {shown(name, 80)}, not a step directory", fix
            )
        ]
    return (root / name, []) if not errors else (None, errors)


def resolve_restore_job(
    job: str, step: int | None, runs_dir: Path, roots: Roots | list[Path], scope: JobScope | None
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
    # A job stored before checkpoints were the project's own may keep them in a directory
    # other projects could write: nothing in it is read, so no answer tells what is there.
    errors = owner_errors(str(root), loc, roots, runs_dir, scope)
    if errors:
        return None, errors
    if step is None:
        return _latest(root, job, roots)
    found = root / f"step_{step}"
    if found.is_dir():
        return found, []
    names = _step_names(root)
    fix = f"use one of {', '.join(names[-10:])}" if names else "it has saved no checkpoint yet"
    msg = f"job {job} has no checkpoint at step {step}"
    return None, [FieldError("restore_from.step", msg, fix)]
