"""Cross entropies that never hold fp32 logits for every token at once.

`ChunkedCrossEntropy` (AutoModel's name and keywords) computes the loss over `chunk_len`
rows at a time: each `[chunk_len, vocab]` slice is upcast to fp32 only while it is used,
backward recomputes the softmax per chunk, and only the logits in their own dtype are
saved. The value and the gradient equal `MaskedCrossEntropy`'s. `FusedLinearCrossEntropy`
and `TEParallelCrossEntropy` are AutoModel's fused-kernel losses; tuneyard's models hand
the loss logits, so both compute the same cross entropy through the chunked path (with
the logit soft-capping `FusedLinearCrossEntropy` takes). Validation warns about the kernels
that are not used.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

REDUCTIONS = ("mean", "sum")


class _ChunkedCESum(torch.autograd.Function):
    """Sum of cross entropy over rows whose label is not `ignore_index`, chunk by chunk."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, ignore: int, chunk: int):
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], chunk):
            part = logits[start : start + chunk].float()
            target = labels[start : start + chunk]
            total += F.cross_entropy(part, target, ignore_index=ignore, reduction="sum")
        ctx.save_for_backward(logits, labels)
        ctx.ignore, ctx.chunk = ignore, chunk
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        logits, labels = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk):
            part = logits[start : start + ctx.chunk].float()
            target = labels[start : start + ctx.chunk]
            keep = target != ctx.ignore
            probs = torch.softmax(part, dim=-1)
            rows = torch.nonzero(keep).squeeze(-1)
            probs[rows, target[rows]] -= 1.0
            probs[~keep] = 0.0
            grad[start : start + ctx.chunk] = (probs * grad_out).to(logits.dtype)
        return grad, None, None, None


def _checked_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return reduction


class ChunkedCrossEntropy(nn.Module):
    """Cross entropy over label tokens, `chunk_len` rows of fp32 logits at a time."""

    def __init__(
        self,
        chunk_len: int = 32,
        compile: bool = False,
        ignore_index: int = -100,
        reduction: str = "sum",
        inplace_grad: bool = False,
    ):
        super().__init__()
        if chunk_len <= 0:
            raise ValueError(f"chunk_len must be positive, got {chunk_len}")
        self.chunk_len = chunk_len
        self.ignore_index = ignore_index
        self.reduction = _checked_reduction(reduction)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        flat_labels = labels.reshape(-1)
        total = _ChunkedCESum.apply(flat, flat_labels, self.ignore_index, self.chunk_len)
        if self.reduction == "sum":
            return total
        return total / (flat_labels != self.ignore_index).sum().clamp(min=1)


class FusedLinearCrossEntropy(ChunkedCrossEntropy):
    """AutoModel's fused linear cross entropy, as the chunked loss over the model's logits."""

    def __init__(
        self,
        ignore_index: int = -100,
        logit_softcapping: float = 0.0,
        reduction: str = "sum",
        impl: str = "cce",
    ):
        super().__init__(chunk_len=1024, ignore_index=ignore_index, reduction=reduction)
        if logit_softcapping < 0:
            raise ValueError(f"logit_softcapping must be >= 0, got {logit_softcapping}")
        self.logit_softcapping = float(logit_softcapping)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.logit_softcapping:
            cap = self.logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return super().forward(logits, labels)


class TEParallelCrossEntropy(ChunkedCrossEntropy):
    """AutoModel's Transformer Engine cross entropy, as the chunked fp32 loss (same value)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "sum"):
        super().__init__(chunk_len=1024, ignore_index=ignore_index, reduction=reduction)
