"""The `benchmark:` section of a benchmark recipe (`recipe: llm_benchmark`) and its rules.

A benchmark runs `warmup_steps` optimizer steps that are not measured, then
`measured_steps` that are, and reports throughput, TFLOP/s per rank and MFU. AutoModel
writes the total as `step_scheduler.max_steps`; tuneyard also takes `measured_steps`, and
derives whichever is missing so that `max_steps == warmup_steps + measured_steps`. Every
step of a benchmark is counted, so `num_epochs` never bounds it, and checkpoints are off
unless the recipe turns them on. `peak_tflops` (per device) replaces the device table
behind MFU. Only a benchmark recipe may carry the section.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from jobs.recipe.errors import FieldError
from jobs.recipe.load.limits import MAX_STEPS, at_most
from jobs.recipe.load.schema import BenchmarkSection
from jobs.recipe.load.schema_errors import field_errors

BENCHMARK_RECIPE = "llm_benchmark"
DEFAULT_MEASURED_STEPS = 10


def check_benchmark(
    data: dict[str, Any], out: dict[str, Any]
) -> tuple[list[FieldError], list[FieldError]]:
    """Set `out["benchmark"]` (None unless a benchmark) and its derived step counts:
    (errors, warnings)."""
    out["benchmark"] = None
    raw = data.get("benchmark")
    if out["recipe"] != BENCHMARK_RECIPE:
        if raw is None:
            return [], []
        msg = "accepted and ignored: only a benchmark recipe (recipe: llm_benchmark) reads it"
        return [], [FieldError("benchmark", msg)]
    section, errors = _validate_section(raw)
    if section is None:
        return errors, []
    schedule = out["step_scheduler"]
    errors = _derive_steps(section, schedule)
    if errors:
        return errors, []
    out["benchmark"] = section
    schedule["max_steps"] = section["warmup_steps"] + section["measured_steps"]
    warnings = _benchmark_defaults(data, out)
    return [], warnings


def _validate_section(raw: Any) -> tuple[dict[str, Any] | None, list[FieldError]]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return None, [FieldError("benchmark", "must be a mapping", "write benchmark: as a mapping")]
    try:
        model = BenchmarkSection.model_validate(raw)
    except ValidationError as exc:
        return None, field_errors(exc, "benchmark", BenchmarkSection.model_fields)
    return model.model_dump(mode="json"), []


def _derive_steps(section: dict[str, Any], schedule: dict[str, Any]) -> list[FieldError]:
    """Fill `measured_steps` from `max_steps` (or the default); refuse counts that disagree."""
    warmup, measured = section["warmup_steps"], section["measured_steps"]
    max_steps = schedule.get("max_steps")
    if measured is None and max_steps is None:
        section["measured_steps"] = DEFAULT_MEASURED_STEPS
    elif measured is None:
        if max_steps <= warmup:
            msg = f"{max_steps} leaves no measured step after benchmark.warmup_steps ({warmup})"
            fix = f"set step_scheduler.max_steps above {warmup}, or lower benchmark.warmup_steps"
            return [FieldError("step_scheduler.max_steps", msg, fix)]
        section["measured_steps"] = max_steps - warmup
    elif max_steps is not None and max_steps != warmup + measured:
        msg = f"{max_steps} is not benchmark.warmup_steps + benchmark.measured_steps ({warmup} + "
        fix = f"set step_scheduler.max_steps: {warmup + measured}, or remove it"
        return [FieldError("step_scheduler.max_steps", f"{msg}{measured})", fix)]
    return _total_errors(warmup, section["measured_steps"])


def _total_errors(warmup: int, measured: int) -> list[FieldError]:
    """Each count is within MAX_STEPS; the run they make (max_steps) must be too."""
    if warmup + measured <= MAX_STEPS:
        return []
    msg = f"makes {warmup + measured} steps with benchmark.warmup_steps {warmup}; at most "
    fix = f"set benchmark.measured_steps to at most {max(1, MAX_STEPS - warmup)}"
    if warmup >= MAX_STEPS:
        fix = f"set benchmark.warmup_steps below {MAX_STEPS}, then {fix}"
    return [FieldError("benchmark.measured_steps", f"{msg}{at_most(MAX_STEPS)}", fix)]


def _benchmark_defaults(data: dict[str, Any], out: dict[str, Any]) -> list[FieldError]:
    """Checkpoints off unless asked for; no epoch bound; no validation runs."""
    warnings = []
    raw_checkpoint = data.get("checkpoint")
    if not (isinstance(raw_checkpoint, dict) and "enabled" in raw_checkpoint):
        out["checkpoint"]["enabled"] = False
    schedule = out["step_scheduler"]
    if schedule.get("num_epochs") is not None:
        schedule["num_epochs"] = None
        msg = "accepted and ignored: a benchmark runs warmup_steps + measured_steps steps"
        warnings.append(FieldError("step_scheduler.num_epochs", msg))
    if schedule.get("val_check_interval") is not None:
        schedule["val_check_interval"] = None
        msg = "accepted and ignored: a benchmark runs no validation"
        warnings.append(FieldError("step_scheduler.val_check_interval", msg))
    if schedule.get("save_checkpoint_every_epoch"):
        schedule["save_checkpoint_every_epoch"] = False
        msg = "accepted and ignored: a benchmark saves one checkpoint at most, at its end"
        warnings.append(FieldError("step_scheduler.save_checkpoint_every_epoch", msg))
    return warnings
