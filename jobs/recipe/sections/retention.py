"""`checkpoint.keep_best` and the retention rule: which checkpoints of a run are kept, and why.

`keep_best: {metric: val_loss, mode: min, k: N}` keeps the N checkpoints whose `val_loss`
(recorded at the checkpoint's own step) is lowest, beside the last `keep_last` and the one
`LATEST` names. A checkpoint saved at a step without a validation (a preemption, an epoch's
end, a final step off the cadence) has no value and is never ranked. With `keep_best` set
and no `keep_last`, only LATEST and the best stay; without either, every checkpoint stays.
`check_keep_best` is the submit-time rule (the metric must be one the run produces at its
checkpoint steps); `keep_reasons` is the one statement of the rule, read by the trainer (to
delete) and by the API (to say why each checkpoint is kept), so the two never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.recipe.errors import FieldError

# The metrics a checkpoint records at its step, with what the run needs to produce them.
RANKABLE_METRICS = ("val_loss", "loss")
LOC = "checkpoint.keep_best"


class KeepBestSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    metric: Literal["val_loss", "loss"] = "val_loss"
    mode: Literal["min", "max"] = "min"
    k: Annotated[int, Field(ge=1, le=1000)]


@dataclass(frozen=True)
class KeepBest:
    metric: str
    mode: str  # "min" or "max"
    k: int


def check_keep_best(out: Mapping[str, Any]) -> list[FieldError]:
    """Whether the run produces `keep_best.metric` at the steps it saves checkpoints."""
    keep_best = (out.get("checkpoint") or {}).get("keep_best")
    if not isinstance(keep_best, dict):
        return []
    if not (out.get("checkpoint") or {}).get("enabled", True):
        fix = "remove checkpoint.keep_best or set checkpoint.enabled: true"
        return [FieldError(LOC, "has no effect: checkpoint.enabled is false", fix)]
    if keep_best.get("metric") != "val_loss":
        return []  # the training loss is recorded at every step
    return _validation_cadence_errors(out)


def _validation_cadence_errors(out: Mapping[str, Any]) -> list[FieldError]:
    """val_loss ranks a checkpoint only when validation ran at its step: a validation set,
    a validation interval, and checkpoint saves on that interval."""
    schedule = out.get("step_scheduler") or {}
    if out.get("validation_dataset") is None:
        return [
            FieldError(
                f"{LOC}.metric",
                "is val_loss but the recipe has no validation_dataset",
                "add a validation_dataset: section, or rank by metric: loss",
            )
        ]
    every_val, every_save = schedule.get("val_check_interval"), schedule.get("checkpoint_interval")
    if not every_val:
        return [
            FieldError(
                "step_scheduler.val_check_interval",
                "is not set, so no checkpoint records a val_loss for checkpoint.keep_best",
                "set step_scheduler.val_check_interval (e.g. equal to checkpoint_interval)",
            )
        ]
    if not every_save:
        msg = "is not set: checkpoint.keep_best ranks the checkpoints saved on an interval"
        fix = f"set step_scheduler.checkpoint_interval to a multiple of {every_val}"
        return [FieldError("step_scheduler.checkpoint_interval", msg, fix)]
    if every_save % every_val:
        return [
            FieldError(
                "step_scheduler.checkpoint_interval",
                f"{every_save} is not a multiple of val_check_interval {every_val}: its "
                "checkpoints would have no val_loss of their own step for checkpoint.keep_best",
                f"set step_scheduler.checkpoint_interval to a multiple of {every_val}, or "
                f"val_check_interval to a divisor of {every_save}",
            )
        ]
    return []


def metric_value(metrics: Mapping[str, Any] | None, metric: str) -> float | None:
    """The finite number `metrics[metric]`, else None (absent, null, NaN, not a number)."""
    value = (metrics or {}).get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def best_ranks(
    metrics_by_step: Mapping[int, Mapping[str, Any] | None], keep_best: KeepBest
) -> dict[int, int]:
    """step -> rank (1 = best) of the `keep_best.k` best checkpoints; ties go to the earlier."""
    sign = 1.0 if keep_best.mode == "min" else -1.0
    scored = [
        (sign * value, step)
        for step, metrics in metrics_by_step.items()
        if (value := metric_value(metrics, keep_best.metric)) is not None
    ]
    return {step: rank for rank, (_, step) in enumerate(sorted(scored)[: keep_best.k], 1)}


def keep_reasons(
    metrics_by_step: Mapping[int, Mapping[str, Any] | None],
    keep_last: int | None,
    keep_best: KeepBest | None,
    latest: int | None,
) -> dict[int, list[str]]:
    """For each checkpoint step, why it is kept; an empty list means it may be deleted.

    `metrics_by_step` is every existing checkpoint with what it recorded at its step;
    `latest` is the step LATEST names (None: no pointer).
    """
    steps = sorted(metrics_by_step)
    reasons: dict[int, list[str]] = {step: [] for step in steps}
    if latest in reasons:
        reasons[latest].append("latest")
    if keep_last is None and keep_best is None:
        for step in steps:
            reasons[step].append("no keep_last or keep_best: every checkpoint is kept")
        return reasons
    if keep_last:
        for step in steps[-keep_last:]:
            reasons[step].append(f"last {keep_last}")
    if keep_best is not None:
        for step, rank in best_ranks(metrics_by_step, keep_best).items():
            reasons[step].append(f"best {keep_best.metric} #{rank} of {keep_best.k}")
    return reasons


def deletion_reason(keep_last: int | None, keep_best: KeepBest | None) -> str:
    """Why the trainer deleted a checkpoint `keep_reasons` left without a reason."""
    parts = [f"not among the last {keep_last}"] if keep_last else []
    if keep_best is not None:
        parts.append(f"not among the {keep_best.k} best by {keep_best.metric} ({keep_best.mode})")
    return ", ".join(parts + ["not LATEST"])
