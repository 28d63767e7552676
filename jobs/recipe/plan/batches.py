"""Batch arithmetic: global = local x dp x grad accumulation, each given or derived once
(a derived size within the maximum a given one has), and the sequence length a step's
tokens are counted with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.load import limits


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
        return _within_maxima(Batches(local, local * dp * accum, accum), dp)
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
    return _within_maxima(Batches(local, global_, derived), dp)


def _within_maxima(batches: Batches, dp: int) -> tuple[Batches | None, list[FieldError]]:
    """A derived local or global batch past the maximum a given one has is refused where
    it can be lowered: global = local x dp x accumulation."""
    if batches.local > limits.MAX_LOCAL_BATCH:
        most = limits.at_most(limits.MAX_LOCAL_BATCH)
        return None, [
            FieldError(
                "dataloader.batch_size",
                f"comes to {batches.local} (global / (dp {dp} x grad_accumulation_steps "
                f"{batches.grad_accumulation_steps})); at most {most} per rank",
                f"set dataloader.batch_size to at most {limits.MAX_LOCAL_BATCH}; grad "
                "accumulation makes up the global batch",
            )
        ]
    if batches.global_ > limits.MAX_GLOBAL_BATCH:
        most = limits.at_most(limits.MAX_GLOBAL_BATCH)
        return None, [
            FieldError(
                "step_scheduler.grad_accumulation_steps",
                f"makes a global batch of {batches.global_} (local {batches.local} x dp {dp} x "
                f"{batches.grad_accumulation_steps}); at most {most}",
                "lower step_scheduler.grad_accumulation_steps or dataloader.batch_size",
            )
        ]
    return batches, []


def seq_length_of(recipe: dict[str, Any]) -> int | None:
    """The pack size when packing, else the dataset's sequence length; None when unknown or
    past `MAX_SEQ_LENGTH` (refused at its field: the plan multiplies nothing with it)."""
    packed = recipe.get("packed_sequence") or {}
    dataset = recipe.get("dataset") or {}
    if packed.get("enabled") and packed.get("packed_sequence_size"):
        values = [packed["packed_sequence_size"]]
    else:
        values = [dataset.get("max_seq_length"), dataset.get("seq_length")]
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value if value <= limits.MAX_SEQ_LENGTH else None
    return None
