"""Token-level cross entropy for causal LMs, plus the helper that turns any loss into a sum.

The collators hand the step loop `labels` that are already shifted (label t is the token
that follows input t, or -100 where no loss is taken: prompt tokens, padding, sample
boundaries in packed rows). `MaskedCrossEntropy` therefore never shifts. The step loop
normalises by the number of label tokens over the whole optimizer step on all data-parallel
ranks, so `token_loss_sum` asks every loss for a sum first.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MaskedCrossEntropy(nn.Module):
    """Cross entropy over positions whose label is not `ignore_index`, computed in fp32."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat_logits = logits.reshape(-1, logits.shape[-1]).float()
        flat_labels = labels.reshape(-1)
        total = F.cross_entropy(
            flat_logits, flat_labels, ignore_index=self.ignore_index, reduction="sum"
        )
        if self.reduction == "sum":
            return total
        count = (flat_labels != self.ignore_index).sum().clamp(min=1)
        return total / count


def token_loss_sum(loss_fn: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss summed over label tokens, whatever reduction `loss_fn` was built with."""
    ignore_index = getattr(loss_fn, "ignore_index", -100)
    count = int((labels != ignore_index).sum())
    if count == 0:  # keep the graph connected so every rank runs the same collectives
        return logits.sum() * 0.0
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    loss = loss_fn(flat_logits, labels.reshape(-1))
    return loss * count if getattr(loss_fn, "reduction", "mean") == "mean" else loss
