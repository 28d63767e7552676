"""The paths a recipe's sections name, checked: model, tokenizer and dataset files inside the
data roots (or cached hub names), checkpoint and restore paths inside the checkpoint roots
and, with a scope, in the caller's own part of them, and dataset keywords that must be
names, not paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.load.plain import is_number
from jobs.recipe.model.hub import offline_errors
from jobs.recipe.paths.forms import check_file_set
from jobs.recipe.paths.roots import (
    PathCheck,
    Roots,
    check_checkpoint_path,
    check_data_path,
    is_hub_name,
)
from jobs.recipe.paths.scope import (
    JobScope,
    confinement_errors,
    foreign_project_errors,
    is_relative_path,
    owner_errors,
    resolve_restore_job,
    run_relative,
    runs_roots,
)
from jobs.recipe.paths.stored import is_store_url, stored_checkpoint_errors
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.targets.table import TARGETS

DATA_PATH_KEYS = ("path_or_dataset", "path", "tokenizer_name_or_path")


# Dataset keywords that name a split or a column: plain names, never paths. Every dataset
# keyword is a path, a name or a number (a test walks the target table).
DATASET_NAME_KEYS = {
    "split": "train",
    "prompt_field": "prompt",
    "completion_field": "completion",
    "messages_field": "messages",
}


def check_data_paths(
    recipe: dict[str, Any],
    settings: RecipeSettings,
    roots: Roots,
    scope: JobScope | None = None,
) -> tuple[dict[str, PathCheck], list[FieldError]]:
    """Model, tokenizer and dataset paths inside the data `roots` (or hub names, cached when
    the server is offline); with a scope, none inside another project's run directory or
    its part of a checkpoint root (decided first: a refusal tells nothing of what exists)."""
    runs = runs_roots(settings.resolved_runs_dir)
    checkpoint_roots = Roots.of(settings.allowed_checkpoint_roots())
    checks: dict[str, PathCheck] = {}
    errors: list[FieldError] = []
    hub: dict[str, Any] = {}
    for loc, value, form in _data_path_values(recipe):
        foreign = [
            error
            for text in _texts(value)
            if not is_hub_name(text)
            for error in foreign_project_errors(text, loc, checkpoint_roots, runs, scope)
        ]
        if foreign:
            check = PathCheck("invalid", None, foreign[:1])
        elif form:
            check = check_file_set(value, loc, roots, form)
        else:
            check = check_data_path(value, loc, roots)
        checks[loc] = check
        errors += check.errors
        if check.path is not None:
            errors += confinement_errors(check.path, loc, runs, scope, check.real)
        if check.kind == "hub":
            hub[loc] = value
    return checks, errors + offline_errors(hub, settings.hub_offline)


def _data_path_values(recipe: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(loc, value, form) of every path a recipe reads; form "" for a plain path."""
    candidates = []
    for name in ("model", "teacher_model"):  # a KD teacher reads files like the student
        model = recipe.get(name) or {}
        path = model.get("pretrained_model_name_or_path")
        candidates.append((f"{name}.pretrained_model_name_or_path", path, ""))
        if isinstance(model.get("config"), str):
            candidates.append((f"{name}.config", model["config"], ""))
        elif isinstance(model.get("config"), dict) and "_target_" in model["config"]:
            nested = model["config"]  # transformers.AutoConfig.from_pretrained
            for key in path_keys(nested):
                candidates.append((f"{name}.config.{key}", nested.get(key), ""))
    for section in FILE_SECTIONS:
        values = recipe.get(section) or {}
        spec = spec_of(values)
        for key in path_keys(values):
            form = spec.path_forms.get(key, "") if spec is not None else ""
            leaves = _path_leaves(values.get(key), f"{section}.{key}", weights=bool(form))
            candidates += [(loc, value, form) for loc, value in leaves]
    return [(loc, value, form) for loc, value, form in candidates if value is not None]


def _texts(value: Any) -> list[str]:
    """The strings of a path-valued field (one path, or a file set's list or mapping)."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [text for item in items for text in _texts(item)]


# Target sections whose keywords may name files: (besides the model's own).
FILE_SECTIONS = ("dataset", "validation_dataset", "tokenizer")


def spec_of(section: dict[str, Any]) -> Any:
    target = section.get("_target_")
    return TARGETS.get(target) if isinstance(target, str) else None


def path_keys(section: dict[str, Any]) -> frozenset[str] | tuple[str, ...]:
    """The keywords of a target section that name files: its spec's, else the common ones."""
    spec = spec_of(section)
    return spec.paths if spec is not None and spec.paths else DATA_PATH_KEYS


def _is_weight(item: Any, weights: bool) -> bool:
    """A blend weight: a number, or (in a weighted file list) a number written as text."""
    if is_number(item):
        return True
    if not (weights and isinstance(item, str)):
        return False
    try:
        float(item)
    except ValueError:
        return False
    return True


def _path_leaves(value: Any, loc: str, weights: bool = False) -> Iterator[tuple[str, Any]]:
    """Each path in a path keyword: itself, or the strings of a list (blend weights skipped)
    or a mapping of them (`{train: [...], validation: [...]}`)."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not _is_weight(item, weights):
                yield from _path_leaves(item, f"{loc}.{index}", weights)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _path_leaves(item, f"{loc}.{key}", weights)
    else:
        yield loc, value


def _checkpoint_path(
    value: Any, loc: str, settings: RecipeSettings, scope: JobScope | None, must_exist: bool
) -> tuple[str | None, list[FieldError]]:
    """One checkpoint path inside the checkpoint roots and, with a scope, in the project's
    own part of them: that is decided first, so whether the path exists tells nothing."""
    roots = Roots.of(settings.allowed_checkpoint_roots())  # for both checks below
    errors = owner_errors(value, loc, roots, settings.resolved_runs_dir, scope)
    if errors:
        return None, errors
    check = check_checkpoint_path(value, loc, roots, must_exist=must_exist)
    return (str(check.path) if check.path is not None else None), check.errors


def check_checkpoint_paths(
    checkpoint: dict[str, Any],
    restore: dict[str, Any] | None,
    settings: RecipeSettings,
    scope: JobScope | None = None,
) -> list[FieldError]:
    """checkpoint_dir (may not exist yet) and restore_from inside the checkpoint roots, and
    with a scope in the project's own part of them; `{job, step}` becomes that job's
    checkpoint.

    Local paths are made absolute in place, so the worker reads what was validated; with a
    scope a relative checkpoint_dir stays relative: the trainer puts it in the run directory.
    """
    errors: list[FieldError] = []
    value, loc = checkpoint.get("checkpoint_dir"), "checkpoint.checkpoint_dir"
    if scope is not None and is_relative_path(value):  # the server: in the job's run dir
        roots, runs = settings.allowed_checkpoint_roots(), settings.resolved_runs_dir
        path, errors = run_relative(value, loc, roots, runs, scope)
        checkpoint["checkpoint_dir"] = path or value
    elif value is not None:
        path, errors = _checkpoint_path(value, loc, settings, scope, False)
        checkpoint["checkpoint_dir"] = path or value
    if restore and "job" in restore:
        errors += _resolve_job_restore(restore, settings, scope)
    elif restore and is_store_url(restore["path"]):  # downloaded by the worker
        loc = "restore_from.path"
        errors += stored_checkpoint_errors(restore["path"], loc, settings.artifact_store, scope)
    elif restore and restore["path"] != "LATEST":
        path, errs = _checkpoint_path(restore["path"], "restore_from.path", settings, scope, True)
        restore["path"] = path or restore["path"]
        errors += errs
    return errors


def _resolve_job_restore(
    restore: dict[str, Any], settings: RecipeSettings, scope: JobScope | None
) -> list[FieldError]:
    """`{job, step}` -> `{path}` in place, once the job's checkpoint passes every path check."""
    roots, runs = Roots.of(settings.allowed_checkpoint_roots()), settings.resolved_runs_dir
    found, errors = resolve_restore_job(restore["job"], restore["step"], runs, roots, scope)
    if found is None:
        return errors
    path, errors = _checkpoint_path(str(found), "restore_from.job", settings, scope, True)
    if not errors:
        restore.clear()
        restore["path"] = path
    return errors
