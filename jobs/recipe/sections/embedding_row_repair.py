"""The `embedding_row_repair:` section: rewrite near-zero input-embedding rows before training.

As in AutoModel's fine-tuning recipe, `embedding_row_repair: {min_norm: 1.0e-4, max_rows:
256}` makes the trainer scan the loaded model's input embedding once, before PEFT and
sharding: a row whose L2 norm is non-finite or at most `min_norm` (inclusive; default
1.0e-6) is replaced by the matching output-embedding row, rescaled to the RMS norm of the
healthy input rows (`trainer.embedding_repair`). More than `max_rows` damaged rows (default
256) stops the run before any weight changes: that many usually means a mismatched
checkpoint, not a few dead tokens. `enabled` defaults to true when the section is there;
`enabled: false`, `null` or `false` drop it with a warning. The other keys are checked even
then, as AutoModel's config checks them. The trainer reads the typed `EmbeddingRowRepair`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.recipe.errors import FieldError
from jobs.recipe.load.schema_errors import field_errors

SECTION = "embedding_row_repair"
NONE_WORDS = frozenset({"none", "null", "~"})
MAX_ROWS_BOUND = 10_000_000  # above any vocabulary: the bound only keeps the number realistic


class EmbeddingRowRepairSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    enabled: bool = True
    min_norm: Annotated[float, Field(ge=0.0, le=1.0e6)] = 1.0e-6
    max_rows: Annotated[int, Field(gt=0, le=MAX_ROWS_BOUND)] = 256


@dataclass(frozen=True)
class EmbeddingRowRepair:
    """`embedding_row_repair:`: rows with norm <= min_norm (or non-finite) are rewritten;
    more than max_rows of them stops the run instead."""

    min_norm: float
    max_rows: int


def _is_off(value: Any) -> bool:
    """AutoModel reads a null or false node (and `none` spelled out) as no section."""
    if isinstance(value, str):
        return value.strip().lower() in NONE_WORDS
    return value is None or value is False


def check_embedding_row_repair(
    data: dict[str, Any],
) -> tuple[dict[str, Any] | None, list[FieldError], list[FieldError]]:
    """The normalized section of the raw recipe `data` (None when absent or not enabled),
    errors and warnings."""
    if SECTION not in data:
        return None, [], []
    value = data[SECTION]
    off = FieldError(SECTION, "accepted and ignored: it is not enabled")
    if _is_off(value):
        return None, [], [off]
    if not isinstance(value, dict):
        fix = f"write {SECTION}: {{min_norm: 1.0e-4, max_rows: 256}}"
        return None, [FieldError(SECTION, "must be a mapping", fix)], []
    if isinstance(value.get("min_norm"), int) and not isinstance(value["min_norm"], bool):
        value = {**value, "min_norm": float(value["min_norm"])}
    try:
        section = EmbeddingRowRepairSection.model_validate(value)
    except ValidationError as exc:
        return None, field_errors(exc, SECTION, EmbeddingRowRepairSection.model_fields), []
    if not section.enabled:
        return None, [], [off]
    return section.model_dump(exclude={"enabled"}), [], []
