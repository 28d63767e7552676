"""Recipe rules for architectures whose Hugging Face layers fuse what the native class splits.

Native Phi-3 keeps q/k/v and gate/up as separate projections; transformers' Phi-3 stores
`qkv_proj` and `gate_up_proj`. The trainer fuses a LoRA adapter trained on the split
projections into the fused layout when it exports it (exact: stacked A, block-diagonal B),
which works for any target list. DoRA adds a per-row magnitude that the fused adapter
must carry for every row of the fused projection, so DoRA on these architectures must
adapt every linear layer (`match_all_linear` with no `exclude_modules`); anything
narrower is refused here rather than after training, when the export would fail.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.model.config import HF_CLASS_WITHOUT_TP, architecture_of


def fused_lora_errors(
    config: dict[str, Any] | None, peft: dict[str, Any] | None
) -> list[FieldError]:
    """DoRA that would leave part of a fused projection unadapted."""
    architecture = architecture_of(config) if config else None
    if not peft or not peft.get("use_dora") or architecture not in HF_CLASS_WITHOUT_TP:
        return []
    if peft.get("match_all_linear") and not peft.get("exclude_modules"):
        return []
    return [
        FieldError(
            "peft.use_dora",
            f"DoRA on {architecture} must adapt every linear layer: its exported adapter "
            "fuses q/k/v and gate/up, magnitudes included",
            "set peft.match_all_linear: true without peft.exclude_modules, or peft.use_dora: false",
        )
    ]
