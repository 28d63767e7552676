"""Knowledge distillation (`recipe: llm_kd`): the teacher, the KD loss and their mix, checked.

A KD recipe is a fine-tuning recipe plus three keys: `teacher_model` (a model `_target_`
section with every check `model` gets: the allowlist, data roots, remote code), `kd_loss_fn`
(a loss `_target_`, tuneyard's `KDLoss` when omitted) and `kd_ratio` (the step loss is
`(1 - kd_ratio) * CE + kd_ratio * KD`, 0.5 when omitted). Here live the rules only KD has:
those keys are refused on any other recipe, the teacher is required, the ratio is a number
in [0, 1], teacher and student share one vocabulary when both configs are readable, and the
parallelisms the trainer cannot give a teacher yet are refused.
"""

from __future__ import annotations

import math
from typing import Any

from jobs.recipe.errors import FieldError, shown

KD_RECIPE = "llm_kd"
KD_KEYS = ("teacher_model", "kd_loss_fn", "kd_ratio")
DEFAULT_KD_LOSS = {"_target_": "tuneyard.loss.KDLoss"}
DEFAULT_KD_RATIO = 0.5
KD_CLASS = "KnowledgeDistillationRecipeForNextTokenPrediction"
TEACHER_EXAMPLE = (
    "add teacher_model: {_target_: tuneyard.models.AutoModelForCausalLM.from_pretrained, "
    "pretrained_model_name_or_path: ...} (a larger model with the student's tokenizer)"
)
NOT_YET = "is not supported by tuneyard's trainer yet"


def prepare_kd_keys(data: dict[str, Any], recipe: str) -> list[FieldError]:
    """KD keys on another recipe are refused (and dropped); a KD recipe gets its defaults."""
    if recipe != KD_RECIPE:
        present = [key for key in KD_KEYS if data.get(key) is not None]
        for key in KD_KEYS:
            data.pop(key, None)
        return [
            FieldError(
                key,
                f"only a knowledge-distillation recipe uses {key} (this recipe is {recipe})",
                f"set recipe: {KD_RECIPE} ({KD_CLASS}) or remove {key}",
            )
            for key in present
        ]
    if data.get("kd_loss_fn") is None:
        data["kd_loss_fn"] = dict(DEFAULT_KD_LOSS)
    if data.get("teacher_model") is None:
        return [FieldError("teacher_model", "is required by recipe llm_kd", TEACHER_EXAMPLE)]
    return []


def check_kd_ratio(value: Any, recipe: str) -> tuple[float | None, list[FieldError]]:
    """The CE/KD mix of a KD recipe as a float in [0, 1]; None for other recipes."""
    if recipe != KD_RECIPE:
        return None, []
    if value is None:
        return DEFAULT_KD_RATIO, []
    fix = "set kd_ratio between 0 (pure cross entropy) and 1 (pure distillation)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, [FieldError("kd_ratio", f"must be a number, got {shown(value)}", fix)]
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None, [FieldError("kd_ratio", f"must be in [0, 1], got {shown(value)}", fix)]
    return float(value), []


def check_kd_loss(section: dict[str, Any]) -> list[FieldError]:
    """A softmax temperature must be a positive, finite number."""
    value = section.get("temperature")
    if value is None:
        return []
    fix = "set kd_loss_fn.temperature to a positive number such as 1.0 or 2.0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [FieldError("kd_loss_fn.temperature", f"must be a number, got {shown(value)}", fix)]
    if not math.isfinite(value) or value <= 0:
        return [FieldError("kd_loss_fn.temperature", f"must be > 0, got {shown(value)}", fix)]
    return []


def as_teacher_errors(errors: list[FieldError]) -> list[FieldError]:
    """Errors the `model` checks report, moved to `teacher_model` (same rules, other section)."""
    return [
        FieldError(
            "teacher_model" + e.loc[len("model") :],
            e.msg,
            e.fix.replace("model.", "teacher_model."),
        )
        if e.loc == "model" or e.loc.startswith("model.")
        else e
        for e in errors
    ]


def vocab_errors(
    student: dict[str, Any] | None, teacher: dict[str, Any] | None
) -> list[FieldError]:
    """Distillation compares distributions over one vocabulary: the sizes must match."""
    s_vocab = (student or {}).get("vocab_size")
    t_vocab = (teacher or {}).get("vocab_size")
    if s_vocab is None or t_vocab is None or s_vocab == t_vocab:
        return []
    return [
        FieldError(
            "teacher_model",
            f"the teacher's vocab_size is {t_vocab} but the student's is {s_vocab}: "
            "distillation needs one shared vocabulary",
            "pick a teacher from the student's model family (same tokenizer)",
        )
    ]


def kd_topology_errors(distributed: dict[str, Any] | None) -> list[FieldError]:
    """The teacher is sharded like the student over data parallelism only, for now."""
    errors = []
    for key, what in (("tp_size", "tensor parallelism"), ("ep_size", "expert parallelism")):
        if int((distributed or {}).get(key) or 1) > 1:
            errors.append(
                FieldError(
                    f"distributed.{key}",
                    f"{what} ({key} > 1) with a teacher model {NOT_YET}",
                    f"set distributed.{key}: 1 (the teacher is sharded with FSDP2 like the student)",
                )
            )
    return errors
