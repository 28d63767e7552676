"""The `wandb:` and `mlflow:` sections: which experiment trackers rank 0 logs to.

A recipe that carries either section makes the trainer log every MetricsSample and
validation record to that tracker as well as to `metrics.jsonl` (`trainer.trackers`). The
keys are AutoModel's: its `wandb:` block is forwarded to `wandb.init`, so every `wandb.init`
keyword is accepted here, used (`WANDB_USED`) or reported as ignored (`WANDB_IGNORED`); its
`mlflow:` block is AutoModel's `MLflowConfig`, all of it used. `wandb.enable: false`
turns W&B off (the section is dropped, with a warning), as in AutoModel. Credentials never
sit in a recipe (it is stored with the job and shown to its readers): they come from the
worker's environment. Paths a tracker writes stay inside the job: a relative path is under
the run directory (the trainer resolves it there), an absolute one must lie in the
checkpoint roots and, for a job the server validates, in its project's own part of them.
Each tracker is an optional package (`pip install 'tuneyard[wandb]'`): `TRACKER_PACKAGES`
names its import name, and the job then requires it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip, shown
from jobs.recipe.load.schema_errors import field_errors
from jobs.recipe.paths.roots import Roots, check_checkpoint_path
from jobs.recipe.paths.scope import JobScope, owner_errors
from jobs.recipe.settings import RecipeSettings

TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
RUN_ID = re.compile(r"\A[A-Za-z0-9_.\-]{1,128}\Z")  # W&B refuses '/', '\\', '#', '?', '%', ':'

# `wandb.init` keywords AutoModel forwards that tuneyard does not pass on, with why.
WANDB_IGNORED: dict[str, str] = {
    "config": "the run's config is the typed recipe tuneyard stores with the job",
    "config_exclude_keys": "the run's config is the whole typed recipe",
    "config_include_keys": "the run's config is the whole typed recipe",
    "allow_val_change": "tuneyard writes the run's config once, at start",
    "reinit": "rank 0 opens exactly one W&B run per job",
    "force": "whether the worker is logged in is its environment's (WANDB_API_KEY)",
    "anonymous": "W&B removed anonymous runs; the worker logs in with WANDB_API_KEY",
    "save_code": "tuneyard never uploads the trainer's source",
    "tensorboard": "tuneyard writes no TensorBoard logs to sync",
    "sync_tensorboard": "tuneyard writes no TensorBoard logs to sync",
    "monitor_gym": "there are no gym environments in LLM fine-tuning",
    "resume_from": "rewinding a W&B run is not wired; a resumed job logs on from its step",
    "fork_from": "forking a W&B run is not wired; a resumed job logs on from its step",
    "settings": "tuneyard sets W&B's settings itself (silent, the run directory)",
}
CREDENTIAL_FIX = {
    "wandb.api_key": "remove wandb.api_key and set WANDB_API_KEY in the worker's environment",
}
# Remote artifact stores an MLflow experiment may name; local paths are checked as paths.
ARTIFACT_SCHEMES = frozenset(
    {"http", "https", "s3", "gs", "wasbs", "abfss", "hdfs", "mlflow-artifacts"}
)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "oracle")
HOSTED_STORES = frozenset({"databricks", "databricks-uc", "uc"})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class WandbSection(_Section):
    project: str | None = None  # None: the worker's WANDB_PROJECT, else W&B's default
    entity: str | None = None
    name: str | None = None  # None or "": derived from the model name, as AutoModel does
    group: str | None = None
    job_type: str | None = None
    notes: str | None = None
    tags: list[str] = []
    save_dir: str | None = None  # AutoModel's name for `dir`; give one of the two
    dir: str | None = None
    mode: Literal["online", "offline", "disabled"] | None = None
    id: str | None = None
    resume: bool | Literal["allow", "never", "must", "auto"] | None = None


class MlflowSection(_Section):
    experiment_name: str = "automodel-experiment"
    run_name: str | None = None
    tracking_uri: str | None = None  # None: the worker's MLFLOW_TRACKING_URI, else the run dir
    artifact_location: str | None = None
    tags: dict[str, str | int | float | bool] = {}
    resume: bool = True  # a resumed job logs on into the MLflow run it started
    description: str | None = None
    flatten_depth: int | None = Field(default=1, ge=0)  # None: flatten the recipe fully


@dataclass(frozen=True)
class Wandb:
    project: str | None
    entity: str | None
    name: str | None
    group: str | None
    job_type: str | None
    notes: str | None
    tags: list[str]
    save_dir: str | None
    dir: str | None  # relative: under the run directory; absolute: in the checkpoint roots
    mode: str | None
    id: str | None
    resume: bool | str | None


@dataclass(frozen=True)
class Mlflow:
    experiment_name: str
    run_name: str | None
    tracking_uri: str | None  # http(s)://, file:<path> or sqlite:///<path>
    artifact_location: str | None
    tags: dict[str, str]
    resume: bool
    description: str | None
    flatten_depth: int | None


SECTIONS: dict[str, type[_Section]] = {"wandb": WandbSection, "mlflow": MlflowSection}
WANDB_USED = frozenset(WandbSection.model_fields)


@dataclass(frozen=True)
class PathRules:
    """Where absolute tracker paths may point, and whose runs they may reach."""

    settings: RecipeSettings
    scope: JobScope | None = None


def check_trackers(
    data: dict[str, Any],
    out: dict[str, Any],
    settings: RecipeSettings,
    scope: JobScope | None = None,
    warnings: list[FieldError] | None = None,
) -> list[FieldError]:
    """`out["wandb"]` / `out["mlflow"]`: the section with defaults filled and its paths
    checked, or None when absent. Ignored keys are appended to `warnings`."""
    errors: list[FieldError] = []
    notes = warnings if warnings is not None else []
    rules = PathRules(settings, scope)
    for name, cls in SECTIONS.items():
        value = data.get(name)
        out[name] = None
        if value is None:
            continue
        if not isinstance(value, dict):
            errors.append(FieldError(name, "must be a mapping", f"write {name}: as a mapping"))
            continue
        if name == "mlflow" and not value:
            why = "an empty mlflow: section turns MLflow on in neither AutoModel nor tuneyard"
            notes.append(FieldError(name, f"accepted and ignored: {why}"))
            continue
        if name == "wandb" and "enable" in value:
            value, errs = _wandb_switch(value, notes)
            errors += errs
            if value is None:
                continue
        value, errs = _prepared(name, value, notes)
        try:
            section = cls.model_validate(value).model_dump(mode="json")
        except ValidationError as exc:
            errors += errs + field_errors(exc, name, cls.model_fields)
            continue
        checks = _wandb_errors if name == "wandb" else _mlflow_errors
        errs += checks(section, rules)
        out[name] = section if not errs else None
        errors += errs
    return errors


def _wandb_switch(
    value: dict[str, Any], warnings: list[FieldError]
) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """AutoModel's `wandb.enable`: the section without it, or None when it is false (W&B off,
    as AutoModel drops the whole section then). Applied after overrides, so
    `--wandb.enable true` turns a recipe's W&B back on, as it does in AutoModel."""
    kept = {k: v for k, v in value.items() if k != "enable"}
    if not isinstance(value["enable"], bool):
        msg = f"must be true or false, got {shown(value['enable'])}"
        return None, [FieldError("wandb.enable", msg, "set wandb.enable: true or false")]
    if value["enable"]:
        return kept, []
    msg = "W&B logging is off: the rest of the wandb section is not used (as in AutoModel)"
    warnings.append(FieldError("wandb.enable", msg))
    return None, []


def _prepared(
    name: str, value: dict[str, Any], warnings: list[FieldError]
) -> tuple[dict[str, Any], list[FieldError]]:
    """The section without its ignored keys (each one a warning) and credential keys."""
    kept, errors = dict(value), []
    for key in list(kept):
        loc = f"{name}.{key}"
        if loc in CREDENTIAL_FIX:
            kept.pop(key)
            msg = "is a credential; a recipe is stored with the job and shown to its readers"
            errors.append(FieldError(loc, msg, CREDENTIAL_FIX[loc]))
        elif name == "wandb" and key in WANDB_IGNORED:
            kept.pop(key)
            warnings.append(FieldError(loc, f"accepted and ignored: {WANDB_IGNORED[key]}"))
    return kept, errors


def _wandb_errors(section: dict[str, Any], rules: PathRules) -> list[FieldError]:
    errors: list[FieldError] = []
    given = [section[k] for k in ("dir", "save_dir") if section[k] is not None]
    if len(set(given)) > 1:
        fix = "give one of wandb.dir and wandb.save_dir (save_dir is AutoModel's name)"
        errors.append(FieldError("wandb.save_dir", "differs from wandb.dir", fix))
    for key in ("dir", "save_dir"):
        if section[key] is not None:
            section[key], errs = _written_path(section[key], f"wandb.{key}", rules)
            errors += errs
    run_id = section["id"]
    if run_id is not None and not RUN_ID.match(run_id):
        fix = "use at most 128 letters, digits, '-', '_' or '.'"
        errors.append(FieldError("wandb.id", f"{shown(run_id)} is not a W&B run id", fix))
    return errors


def _mlflow_errors(section: dict[str, Any], rules: PathRules) -> list[FieldError]:
    section["tags"] = {k: _tag_text(v) for k, v in section["tags"].items()}
    errors: list[FieldError] = []
    if section["tracking_uri"] is not None:
        section["tracking_uri"], errs = _tracking_uri(section["tracking_uri"], rules)
        errors += errs
    if section["artifact_location"] is not None:
        section["artifact_location"], errs = _artifact_location(section["artifact_location"], rules)
        errors += errs
    return errors


def _tag_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _tracking_uri(value: str, rules: PathRules) -> tuple[str, list[FieldError]]:
    """http(s) servers as given; file and sqlite stores as paths that stay in the job."""
    loc, parts = "mlflow.tracking_uri", urlsplit(value)
    scheme = parts.scheme.lower()
    fix = (
        "give an http(s):// tracking server, file:<path> or sqlite:///<path> inside the run "
        "directory or the checkpoint roots, or leave it out to use the worker's "
        "MLFLOW_TRACKING_URI"
    )
    if scheme in ("http", "https"):
        return value, _server_errors(value, loc)
    if value.lower() in HOSTED_STORES:  # MLflow reads these names as stores, not as paths
        scheme = value.lower()
    if scheme.startswith(DATABASE_SCHEMES):
        msg = f"a {clip(scheme, QUOTE_MAX)} tracking store puts its password in the recipe"
        fix = "run an MLflow tracking server and give its http(s) URI, or set "
        fix += "MLFLOW_TRACKING_URI in the worker's environment"
        return value, [FieldError(loc, msg, fix)]
    if scheme == "sqlite":
        if not value.startswith("sqlite:///") or parts.query or len(value) == len("sqlite:///"):
            msg = f"{shown(value)} is not a sqlite database file (sqlite:///<path>)"
            return value, [FieldError(loc, msg, fix)]
        path, errors = _written_path(value[len("sqlite:///") :], loc, rules)
        return f"sqlite:///{path}", errors
    if scheme in ("", "file"):
        return _file_uri(value, loc, rules, fix)
    return value, [
        FieldError(loc, f"{clip(scheme, QUOTE_MAX)}: is not a tracking store tuneyard runs", fix)
    ]


def _artifact_location(value: str, rules: PathRules) -> tuple[str, list[FieldError]]:
    loc, scheme = "mlflow.artifact_location", urlsplit(value).scheme.lower()
    if scheme in ARTIFACT_SCHEMES:
        return value, _server_errors(value, loc)
    if scheme in ("", "file"):
        fix = "give file:<path> inside the run directory or the checkpoint roots"
        return _file_uri(value, loc, rules, fix)
    accepted = ", ".join(sorted(ARTIFACT_SCHEMES))
    fix = f"give a local path or a URI of one of {accepted}"
    return value, [
        FieldError(loc, f"{clip(scheme, QUOTE_MAX)}: is not an artifact store tuneyard knows", fix)
    ]


def _server_errors(value: str, loc: str) -> list[FieldError]:
    parts = urlsplit(value)
    if parts.username is not None or parts.password is not None:
        msg = "carries a user name or password; a recipe is shown to its readers"
        fix = "remove them and set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD "
        fix += "(or MLFLOW_TRACKING_TOKEN) in the worker's environment"
        return [FieldError(loc, msg, fix)]
    if parts.scheme.lower() in ("http", "https") and not parts.hostname:
        return [FieldError(loc, f"{shown(value)} names no host", f"give {loc} as http(s)://host")]
    return []


def _file_uri(value: str, loc: str, rules: PathRules, fix: str) -> tuple[str, list[FieldError]]:
    """`file:<path>` (or a bare path) as `file:<checked path>`: local, inside the job."""
    if not value.lower().startswith("file:"):
        path, errors = _written_path(value, loc, rules)
        return f"file:{path}", errors
    parts = urlsplit(value)
    if parts.netloc not in ("", "localhost"):
        msg = (
            f"{shown(value)} names host {shown(parts.netloc)}; a file store is local to the worker"
        )
        return value, [FieldError(loc, msg, fix)]
    raw = unquote(parts.path if value[5:].startswith("//") else value[5:])
    path, errors = _written_path(raw, loc, rules)
    return f"file:{path}", errors


def _written_path(value: str, loc: str, rules: PathRules) -> tuple[str, list[FieldError]]:
    """A path a tracker writes: relative stays relative (the trainer puts it under the run
    directory) but may not climb out with '..'; absolute must lie in the checkpoint roots."""
    fix = "give a path inside the run directory (relative, no '..') or an absolute path "
    fix += "inside the checkpoint roots"
    if not value.strip() or "\x00" in value:
        return value, [FieldError(loc, "must be a non-empty path without NUL characters", fix)]
    raw = Path(value).expanduser()
    if not raw.is_absolute():
        normal = os.path.normpath(raw)
        if normal == ".." or normal.startswith(f"..{os.sep}"):
            return value, [
                FieldError(loc, f"{shown(value)} escapes the run directory with '..'", fix)
            ]
        return normal, []
    roots = Roots.of(rules.settings.allowed_checkpoint_roots())  # for both checks below
    runs = rules.settings.resolved_runs_dir
    errors = owner_errors(str(raw), loc, roots, runs, rules.scope)  # with a scope: its own
    if errors:
        return value, errors
    check = check_checkpoint_path(str(raw), loc, roots, must_exist=False)
    return (str(check.path) if check.path is not None else value), check.errors


def tracker_packages(normalized: dict[str, Any]) -> set[str]:
    """Import names of the tracker packages a normalized recipe needs."""
    return {pkg for name, pkg in TRACKER_PACKAGES.items() if normalized.get(name) is not None}
