"""Value rules of single sections: the optimizer's learning rate, the scheduler's bounds,
PEFT, sequence packing and the dataset's numeric keywords.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.load.plain import is_number
from jobs.recipe.paths.data import DATASET_NAME_KEYS, spec_of
from jobs.recipe.paths.roots import name_errors


def check_optimizer(optimizer: dict[str, Any]) -> list[FieldError]:
    lr = optimizer.get("lr")
    if lr is not None and (not is_number(lr) or lr <= 0):
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
    if min_lr is not None and (not is_number(min_lr) or min_lr < 0):
        errors.append(
            FieldError(
                "lr_scheduler.min_lr",
                f"must be a number >= 0, got {min_lr!r}",
                "set lr_scheduler.min_lr: 0.0",
            )
        )
    elif min_lr is not None and is_number(lr) and min_lr > lr:
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
    from jobs.recipe.load.schema import THD_COLLATE_FN  # schema's constant; no import cycle

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
    spec = spec_of(section)
    names = {**DATASET_NAME_KEYS, **(spec.names if spec is not None else {})}
    for key, example in names.items():
        if section.get(key) is not None:
            errors += name_errors(section[key], f"{loc}.{key}", example)
    return errors
