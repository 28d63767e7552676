"""Cross-field recipe rules: paths and names, batch arithmetic, optimizer and scheduler bounds.

Each function takes parts of the normalized recipe and returns `FieldError`s at the field
to change (and, where it resolves something, the resolved values).
`jobs.recipe.normalize` calls them in order; none of them imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.hub_offline import offline_errors
from jobs.recipe.path_forms import check_file_set
from jobs.recipe.paths import PathCheck, check_checkpoint_path, check_data_path, name_errors
from jobs.recipe.scope import JobScope, confinement_errors, resolve_restore_job
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.target_table import TARGETS

DATA_PATH_KEYS = ("path_or_dataset", "path", "tokenizer_name_or_path")
# Dataset keywords that name a split or a column: plain names, never paths. Every dataset
# keyword is a path, a name or a number (a test walks the target table).
DATASET_NAME_KEYS = {
    "split": "train",
    "prompt_field": "prompt",
    "completion_field": "completion",
    "messages_field": "messages",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_data_paths(
    recipe: dict[str, Any],
    settings: RecipeSettings,
    scope: JobScope | None = None,
) -> tuple[dict[str, PathCheck], list[FieldError]]:
    """Model, tokenizer and dataset paths inside the data roots (or hub names, cached when
    the server is offline); with a scope, none inside another project's run directory."""
    roots, runs = settings.allowed_data_roots(), settings.resolved_runs_dir
    checks: dict[str, PathCheck] = {}
    errors: list[FieldError] = []
    hub: dict[str, Any] = {}
    for loc, value, form in _data_path_values(recipe):
        if form:
            check = check_file_set(value, loc, roots, form)
        else:
            check = check_data_path(value, loc, roots)
        checks[loc] = check
        errors += check.errors
        if check.path is not None:
            errors += confinement_errors(check.path, loc, runs, scope)
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
        spec = _spec_of(values)
        for key in path_keys(values):
            form = spec.path_forms.get(key, "") if spec is not None else ""
            leaves = _path_leaves(values.get(key), f"{section}.{key}", weights=bool(form))
            candidates += [(loc, value, form) for loc, value in leaves]
    return [(loc, value, form) for loc, value, form in candidates if value is not None]


# Target sections whose keywords may name files: (besides the model's own).
FILE_SECTIONS = ("dataset", "validation_dataset", "tokenizer")


def _spec_of(section: dict[str, Any]) -> Any:
    target = section.get("_target_")
    return TARGETS.get(target) if isinstance(target, str) else None


def path_keys(section: dict[str, Any]) -> frozenset[str] | tuple[str, ...]:
    """The keywords of a target section that name files: its spec's, else the common ones."""
    spec = _spec_of(section)
    return spec.paths if spec is not None and spec.paths else DATA_PATH_KEYS


def _is_weight(item: Any, weights: bool) -> bool:
    """A blend weight: a number, or (in a weighted file list) a number written as text."""
    if _is_number(item):
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
    """One checkpoint path inside the checkpoint roots and, with a scope, the project's runs."""
    roots = settings.allowed_checkpoint_roots()
    check = check_checkpoint_path(value, loc, roots, must_exist=must_exist)
    if check.path is None:
        return None, check.errors
    errors = confinement_errors(check.path, loc, settings.resolved_runs_dir, scope)
    return str(check.path), errors


def check_checkpoint_paths(
    checkpoint: dict[str, Any],
    restore: dict[str, Any] | None,
    settings: RecipeSettings,
    scope: JobScope | None = None,
) -> list[FieldError]:
    """checkpoint_dir (may not exist yet) and restore_from inside the checkpoint roots, and
    with a scope inside the project's own runs; `{job, step}` becomes that job's checkpoint.

    Local paths are made absolute in place, so the worker reads what was validated.
    """
    errors: list[FieldError] = []
    if checkpoint.get("checkpoint_dir") is not None:
        path, errors = _checkpoint_path(
            checkpoint["checkpoint_dir"], "checkpoint.checkpoint_dir", settings, scope, False
        )
        checkpoint["checkpoint_dir"] = path or checkpoint["checkpoint_dir"]
    if restore and "job" in restore:
        errors += _resolve_job_restore(restore, settings, scope)
    elif restore and restore["path"] != "LATEST":
        path, errs = _checkpoint_path(restore["path"], "restore_from.path", settings, scope, True)
        restore["path"] = path or restore["path"]
        errors += errs
    return errors


def _resolve_job_restore(
    restore: dict[str, Any], settings: RecipeSettings, scope: JobScope | None
) -> list[FieldError]:
    """`{job, step}` -> `{path}` in place, once the job's checkpoint passes every path check."""
    roots, runs = settings.allowed_checkpoint_roots(), settings.resolved_runs_dir
    found, errors = resolve_restore_job(restore["job"], restore["step"], runs, roots, scope)
    if found is None:
        return errors
    path, errors = _checkpoint_path(str(found), "restore_from.job", settings, scope, True)
    if not errors:
        restore.clear()
        restore["path"] = path
    return errors


@dataclass(frozen=True)
class Batches:
    local: int
    global_: int
    grad_accumulation_steps: int


def resolve_batches(
    step: dict[str, Any],
    dataloader: dict[str, Any],
    dp: int | None,
) -> tuple[Batches | None, list[FieldError]]:
    """grad_accumulation_steps = global / (local * dp), a positive integer."""
    local_dl, local_ss = dataloader.get("batch_size"), step.get("local_batch_size")
    if local_dl and local_ss and local_dl != local_ss:
        return None, [
            FieldError(
                "dataloader.batch_size",
                f"{local_dl} conflicts with step_scheduler.local_batch_size {local_ss}",
                "give the local batch size once",
            )
        ]
    global_, accum = step.get("global_batch_size"), step.get("grad_accumulation_steps")
    if dp is None:
        return None, []
    local = local_dl or local_ss
    if local is None:
        local = global_ // (dp * accum) if global_ and accum and global_ % (dp * accum) == 0 else 1
    if global_ is None:
        accum = accum or 1
        return Batches(local, local * dp * accum, accum), []
    per_step = local * dp
    if global_ % per_step:
        return None, [
            FieldError(
                "step_scheduler.global_batch_size",
                f"{global_} is not a multiple of local batch {local} x dp {dp} = {per_step}",
                f"set step_scheduler.global_batch_size to a "
                f"multiple of {per_step}, e.g. {per_step * max(1, global_ // per_step)}",
            )
        ]
    derived = global_ // per_step
    if accum is not None and accum != derived:
        return None, [
            FieldError(
                "step_scheduler.grad_accumulation_steps",
                f"{accum} disagrees with global / (local x dp) = {global_} / "
                f"{per_step} = {derived}",
                f"set step_scheduler.grad_accumulation_steps: {derived} or remove it",
            )
        ]
    return Batches(local, global_, derived), []


def check_optimizer(optimizer: dict[str, Any]) -> list[FieldError]:
    lr = optimizer.get("lr")
    if lr is not None and (not _is_number(lr) or lr <= 0):
        return [
            FieldError(
                "optimizer.lr", f"must be a number > 0, got {lr!r}", "set optimizer.lr: 1.0e-5"
            )
        ]
    return []


def check_lr_scheduler(
    scheduler: dict[str, Any],
    lr: Any,
    max_steps: int | None,
) -> list[FieldError]:
    errors: list[FieldError] = []
    min_lr, warmup = scheduler.get("min_lr"), scheduler.get("warmup_steps")
    if min_lr is not None and (not _is_number(min_lr) or min_lr < 0):
        errors.append(
            FieldError(
                "lr_scheduler.min_lr",
                f"must be a number >= 0, got {min_lr!r}",
                "set lr_scheduler.min_lr: 0.0",
            )
        )
    elif min_lr is not None and _is_number(lr) and min_lr > lr:
        errors.append(
            FieldError(
                "lr_scheduler.min_lr",
                f"{min_lr} is above optimizer.lr {lr}",
                f"set lr_scheduler.min_lr <= {lr}",
            )
        )
    if warmup is not None and (
        not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0
    ):
        errors.append(
            FieldError(
                "lr_scheduler.warmup_steps",
                f"must be an integer >= 0, got {warmup!r}",
                "set lr_scheduler.warmup_steps: 0",
            )
        )
    else:
        limit = scheduler.get("max_steps") or max_steps
        if warmup is not None and isinstance(limit, int) and warmup > limit:
            errors.append(
                FieldError(
                    "lr_scheduler.warmup_steps",
                    f"{warmup} exceeds max_steps {limit}",
                    f"set lr_scheduler.warmup_steps <= {limit}",
                )
            )
    return errors


def check_peft(peft: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[FieldError]]:
    if peft is None:
        return None, []
    if peft.get("match_all_linear") and peft.get("target_modules"):
        return None, [
            FieldError(
                "peft.target_modules",
                "cannot be combined with match_all_linear: true",
                "remove one of peft.target_modules and peft.match_all_linear",
            )
        ]
    if peft.get("match_all_linear") is None:
        peft = {**peft, "match_all_linear": not peft.get("target_modules")}
    return peft, []


def check_packing(
    packed: dict[str, Any],
    dataset: dict[str, Any],
    loaders: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[FieldError]]:
    """Resolve `enabled` and the pack size; the THD collater in `loaders` needs packed rows."""
    from jobs.recipe.schema import THD_COLLATE_FN  # schema's constant; no import cycle

    enabled = packed.get("enabled")
    size = packed.get("packed_sequence_size") or 0
    if enabled is None:
        enabled = size > 0
    packed = {**packed, "enabled": enabled}
    if enabled and size == 0:
        seq = dataset.get("max_seq_length") or dataset.get("seq_length")
        if not isinstance(seq, int) or seq <= 0:
            return packed, [
                FieldError(
                    "packed_sequence.packed_sequence_size",
                    "packing needs a pack size",
                    "set packed_sequence.packed_sequence_size",
                )
            ]
        packed["packed_sequence_size"] = seq
    errors = [
        FieldError(
            f"{name}.collate_fn",
            "packed_sequence_thd_collater collates packed rows, but packing is off",
            "set packed_sequence.packed_sequence_size (e.g. 1024), or use "
            "nemo_automodel.components.datasets.utils.default_collater",
        )
        for name, loader in (loaders or {}).items()
        if not enabled and isinstance(loader, dict) and loader.get("collate_fn") == THD_COLLATE_FN
    ]
    return packed, errors


def seq_length_of(recipe: dict[str, Any]) -> int | None:
    packed = recipe.get("packed_sequence") or {}
    if packed.get("enabled") and packed.get("packed_sequence_size"):
        return int(packed["packed_sequence_size"])
    dataset = recipe.get("dataset") or {}
    for key in ("max_seq_length", "seq_length"):
        value = dataset.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


_POSITIVE_DATASET_KWARGS = (
    "max_seq_length",
    "seq_length",
    "limit_dataset_samples",
    "num_samples",
    "vocab_size",
)
DATASET_NUMBER_KEYS = (*_POSITIVE_DATASET_KWARGS, "seed")  # seed: any integer


def check_dataset_values(section: dict[str, Any], loc: str) -> list[FieldError]:
    errors = []
    for key in _POSITIVE_DATASET_KWARGS:
        value = section.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value <= 0
        ):
            errors.append(
                FieldError(
                    f"{loc}.{key}",
                    f"must be a positive integer, got {value!r}",
                    f"set {loc}.{key} to a positive integer",
                )
            )
    spec = _spec_of(section)
    names = {**DATASET_NAME_KEYS, **(spec.names if spec is not None else {})}
    for key, example in names.items():
        if section.get(key) is not None:
            errors += name_errors(section[key], f"{loc}.{key}", example)
    return errors
