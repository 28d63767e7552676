"""The `neftune:` section: noisy input embeddings while training (NEFTune).

As in AutoModel's fine-tuning recipe, `neftune: {noise_alpha: 5.0}` (or `neftune: 5.0`)
adds uniform noise in [-m, m], m = noise_alpha / sqrt(L * d) (L the batch's sequence length,
d the hidden size), to the input embeddings' output on every training forward; validation
and evaluation see the clean embeddings. `noise_alpha: 0` adds nothing (the section is
dropped, with a warning). The trainer reads the typed `Neftune` (`trainer.neftune`).

The noise is drawn on each rank from its own generator, so it must not land on activations
that ranks hold as copies of one tensor or as slices of one sequence: tensor parallelism
(replicated or sequence-sharded embedding output), context parallelism (L would be a
shard's) and pipeline parallelism (the embedding lives on one stage of a split model) are
refused with it; data parallelism, FSDP2, HSDP, DDP and expert parallelism run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.recipe.errors import FieldError
from jobs.recipe.load.plain import is_number
from jobs.recipe.load.schema_errors import field_errors

SPLITS = {
    "tp_size": "tensor parallelism holds the embedding output as copies or sequence slices",
    "cp_size": "context parallelism gives each rank a slice of the sequence",
    "pp_size": "pipeline parallelism places the embedding on one stage of a split model",
}


class NeftuneSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    noise_alpha: Annotated[float, Field(ge=0.0, le=1000.0)] = 5.0


@dataclass(frozen=True)
class Neftune:
    """`neftune:`: the noise scale; m = noise_alpha / sqrt(seq_len * hidden_size)."""

    noise_alpha: float


def _size(distributed: Any, key: str) -> int:
    value = distributed.get(key) if isinstance(distributed, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def check_neftune(
    value: Any, distributed: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, list[FieldError], list[FieldError]]:
    """The normalized section (None when absent or alpha is 0), errors and warnings."""
    if value is None:
        return None, [], []
    if is_number(value):  # AutoModel's short form: the alpha itself
        value = {"noise_alpha": float(value)}
    if isinstance(value, dict) and isinstance(value.get("noise_alpha"), int):
        value = {**value, "noise_alpha": float(value["noise_alpha"])}
    if not isinstance(value, dict):
        fix = "write neftune: {noise_alpha: 5.0}"
        return None, [FieldError("neftune", "must be a mapping or a number", fix)], []
    try:
        section = NeftuneSection.model_validate(value)
    except ValidationError as exc:
        return None, field_errors(exc, "neftune", NeftuneSection.model_fields), []
    if section.noise_alpha == 0:
        note = FieldError("neftune.noise_alpha", "accepted and ignored: 0 adds no noise")
        return None, [], [note]
    errors = [
        FieldError(
            f"distributed.{key}",
            f"{_size(distributed, key)} cannot run with neftune: {why}, and each rank would "
            "draw its own noise for them",
            f"set distributed.{key}: 1, or remove neftune",
        )
        for key, why in SPLITS.items()
        if _size(distributed, key) > 1
    ]
    return section.model_dump(), errors, []
