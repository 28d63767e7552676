"""AutoModel's spellings of recipe values, rewritten into tuneyard's canonical forms.

`fold_value_forms` runs on the raw recipe before the schema: `torch_dtype: bf16` becomes
`bfloat16`, a string `peft.target_modules` glob becomes a one-item list,
`checkpoint.save_consolidated: final|every` becomes true, a `collate_fn` mapping becomes its
dotted name, `"none"` and null sizes and optional sections become absent, a top-level `seed`
beside `rng.seed` yields to it, numbers spelled as strings become numbers
(`jobs.recipe.automodel.numbers`), pipeline schedule names are spelled as torch spells them,
a `pipeline` block with `pp_size: 1` is dropped, and an `lr_scheduler` written as
AutoModel's scheduler config (no `_target_`) names `tuneyard.schedulers.WarmupDecay`.
Each rewrite that changes what the recipe says is reported as a warning; a form the
trainer cannot run is an error at its field.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.automodel.numbers import fold_numeric_strings
from jobs.recipe.errors import FieldError, shown

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "torch.bf16": "bfloat16",
}
NONE_WORDS = frozenset({"none", "null", "~"})
OPTIONAL_SECTIONS = (
    "peft",
    "validation_dataset",
    "validation_dataloader",
    "lr_scheduler",
    "restore_from",
    "packed_sequence",
    "fp8",
    "qat",
    "compile",
    "clip_grad_norm",
    "loss_fn",
    "autocast",
    "quantization",
    "neftune",
)
FIXED_VALUE_SECTIONS = (
    "step_scheduler",
    "rng",
    "dist_env",
    "compile",
    "clip_grad_norm",
    "packed_sequence",
    "dataloader",
    "validation_dataloader",
    "checkpoint",
    "peft",
    "fp8",
    "qat",
)
SIZE_KEYS = ("dp_replicate_size", "tp_size", "pp_size", "cp_size", "ep_size")
WARMUP_DECAY = "tuneyard.schedulers.WarmupDecay"
DECAY_STYLES = ("cosine", "linear", "constant", "inverse-square-root")
SCHEDULER_KEYS = frozenset(
    {"lr_warmup_steps", "lr_decay_steps", "lr_decay_style", "init_lr", "max_lr", "min_lr"}
)
SCHEDULER_RESUME_KEYS = ("use_checkpoint_opt_param_scheduler", "override_opt_param_scheduler")
WD_KEYS = ("start_wd", "end_wd", "wd_incr_steps", "wd_incr_style")


def is_none_word(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)


def fold_value_forms(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """Rewrite AutoModel value forms in place; returns (errors, warnings)."""
    for name in OPTIONAL_SECTIONS:
        if name in data and is_none_word(data[name]):
            data.pop(name)
    for name in FIXED_VALUE_SECTIONS:
        _none_words_to_null(data.get(name))
    fold_numeric_strings(data)
    warnings = _model_forms(data.get("model")) + _model_forms(data.get("teacher_model"))
    warnings += _checkpoint_forms(data.get("checkpoint"))
    warnings += _collate_forms(data) + _seed_forms(data) + _peft_forms(data.get("peft"))
    warnings += distributed_forms(data.get("distributed"))
    errors, more = scheduler_forms(data)
    return errors, warnings + more


def _none_words_to_null(section: Any) -> None:
    if isinstance(section, dict):
        for key, value in section.items():
            if isinstance(value, str) and is_none_word(value):
                section[key] = None


def _model_forms(model: Any) -> list[FieldError]:
    if not isinstance(model, dict):
        return []
    for key in ("dtype", "torch_dtype"):
        value = model.get(key)
        if isinstance(value, str) and value.lower() in DTYPE_ALIASES:
            model[key] = DTYPE_ALIASES[value.lower()]
    return []


def _checkpoint_forms(checkpoint: Any) -> list[FieldError]:
    if not isinstance(checkpoint, dict):
        return []
    value = checkpoint.get("save_consolidated")
    if value == "every":
        checkpoint["save_consolidated"] = True
    elif value == "final":
        checkpoint["save_consolidated"] = True
        msg = "'final' is read as true: tuneyard consolidates every checkpoint, not only the last"
        return [FieldError("checkpoint.save_consolidated", msg)]
    return []


def _collate_forms(data: dict[str, Any]) -> list[FieldError]:
    """`collate_fn: {_target_: name, **kwargs}` -> the name; its kwargs are reported ignored."""
    warnings = []
    for name in ("dataloader", "validation_dataloader"):
        section = data.get(name)
        collate = section.get("collate_fn") if isinstance(section, dict) else None
        if not isinstance(collate, dict) or not isinstance(collate.get("_target_"), str):
            continue
        section["collate_fn"] = collate["_target_"]
        for key in sorted(k for k in collate if k != "_target_"):
            msg = "accepted and ignored: tuneyard's collater pads each batch to its longest sample"
            warnings.append(FieldError(f"{name}.collate_fn.{key}", msg))
    return warnings


def _seed_forms(data: dict[str, Any]) -> list[FieldError]:
    rng = data.get("rng")
    if "seed" not in data or not isinstance(rng, dict) or rng.get("seed") is None:
        return []
    seed = data.pop("seed")
    if seed == rng["seed"]:
        return []
    msg = (
        f"accepted and ignored: rng.seed ({shown(rng['seed'])}) seeds the run, "
        f"not seed ({shown(seed)})"
    )
    return [FieldError("seed", msg, "keep only rng.seed")]


def _peft_forms(peft: Any) -> list[FieldError]:
    if isinstance(peft, dict):
        for key in ("target_modules", "exclude_modules"):
            if isinstance(peft.get(key), str):
                peft[key] = [peft[key]]
    return []


def schedule_name(value: str) -> str:
    """torch's pipeline schedule names, case- and underscore-insensitive (`interleaved1f1b`)."""
    return value.replace("_", "").replace("-", "").lower()


def distributed_forms(section: Any) -> list[FieldError]:
    """Null sizes -> 1, torch's schedule spellings, and a pipeline block without pipelining."""
    if not isinstance(section, dict):
        return []
    for key in SIZE_KEYS:
        if key in section and is_none_word(section[key]):
            section.pop(key)
    for alias in ("pipeline_config", "pipeline"):
        block = section.get(alias)
        if isinstance(block, dict) and isinstance(block.get("pp_schedule"), str):
            block["pp_schedule"] = schedule_name(block["pp_schedule"])
    pp = section.get("pp_size", 1)
    if isinstance(pp, int) and pp <= 1:
        for alias in ("pipeline_config", "pipeline"):
            if alias in section:
                section.pop(alias)
                msg = "accepted and ignored: pp_size is 1, so there is no pipeline to configure"
                return [FieldError(f"distributed.{alias}", msg)]
    return []


def scheduler_forms(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """AutoModel's LR scheduler config (no `_target_`) -> `tuneyard.schedulers.WarmupDecay`."""
    section = data.get("lr_scheduler")
    if not isinstance(section, dict) or "_target_" in section:
        return [], []
    warnings = [
        FieldError(
            f"lr_scheduler.{key}",
            "accepted and ignored: a restored run always resumes the scheduler from its checkpoint",
        )
        for key in SCHEDULER_RESUME_KEYS
        if section.pop(key, None) is not None
    ]
    errors = _weight_decay_errors(section) + _decay_style_errors(section)
    unknown = sorted(set(section) - SCHEDULER_KEYS)
    errors += [
        FieldError(
            f"lr_scheduler.{key}",
            f"AutoModel's scheduler config has no key {shown(key)}",
            "accepted: " + ", ".join(sorted(SCHEDULER_KEYS)),
        )
        for key in unknown
    ]
    section["_target_"] = WARMUP_DECAY
    return errors, warnings


def _weight_decay_errors(section: dict[str, Any]) -> list[FieldError]:
    """Weight decay stays the optimizer's; a ramp the trainer would not run is refused."""
    given = {key: section.pop(key) for key in WD_KEYS if key in section}
    style = given.get("wd_incr_style", "constant")
    ramps = style != "constant" or given.get("start_wd", given.get("end_wd")) != given.get(
        "end_wd", given.get("start_wd")
    )
    if not ramps:
        return []
    msg = "a weight-decay ramp (start_wd -> end_wd) is not supported by tuneyard's trainer yet"
    return [
        FieldError(
            "lr_scheduler.wd_incr_style", msg, "remove the wd keys and set optimizer.weight_decay"
        )
    ]


def _decay_style_errors(section: dict[str, Any]) -> list[FieldError]:
    style = section.get("lr_decay_style", "cosine")
    if style in DECAY_STYLES:
        return []
    if style == "WSD":
        section.pop("wsd_decay_steps", None)
        section.pop("lr_wsd_decay_style", None)
        msg = "the WSD decay style is not supported by tuneyard's trainer yet"
    else:
        msg = f"unknown decay style {shown(style)}"
    return [FieldError("lr_scheduler.lr_decay_style", msg, "use one of " + ", ".join(DECAY_STYLES))]


def _count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _rate(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def check_warmup_decay(section: dict[str, Any], lr: Any, max_steps: int | None) -> list[FieldError]:
    """The WarmupDecay schedule's numbers: counts, LRs >= 0, warm-up shorter than the decay."""
    if section.get("_target_") != WARMUP_DECAY:
        return []
    errors = [
        FieldError(
            f"lr_scheduler.{key}",
            f"must be an integer >= {low}, got {shown(section[key])}",
            f"set lr_scheduler.{key} to an integer >= {low}",
        )
        for key, low in (("lr_warmup_steps", 0), ("lr_decay_steps", 1))
        if section.get(key) is not None and not _count(section[key], low)
    ]
    errors += [
        FieldError(
            f"lr_scheduler.{key}",
            f"must be a number >= 0, got {shown(section[key])}",
            f"set lr_scheduler.{key} to a number >= 0",
        )
        for key in ("init_lr", "max_lr", "min_lr")
        if section.get(key) is not None and not _rate(section[key])
    ]
    if errors:
        return errors
    peak = section.get("max_lr", lr)
    for key in ("init_lr", "min_lr"):
        if _rate(section.get(key)) and _rate(peak) and section[key] > peak:
            msg = f"{section[key]} is above the peak LR {peak}"
            errors.append(FieldError(f"lr_scheduler.{key}", msg, f"set it <= {peak}"))
    decay, warmup = section.get("lr_decay_steps") or max_steps, section.get("lr_warmup_steps")
    if warmup is not None and isinstance(decay, int) and warmup >= decay:
        msg = f"{warmup} warm-up steps leave nothing of the {decay}-step decay"
        errors.append(FieldError("lr_scheduler.lr_warmup_steps", msg, f"set it below {decay}"))
    return errors
