"""The knowledge-distillation loss: forward KL from the teacher's to the student's distribution.

`KDLoss` takes both models' logits over one vocabulary and the (already shifted) labels, and
averages `KL(P_teacher || P_student)` over the positions whose label is not `ignore_index`,
so prompt tokens and padding teach nothing, as in cross entropy. Both logits are divided by
`temperature` before the softmax and the result is multiplied by `temperature ** 2`, so the
gradient's size does not change with the temperature. `reduction="sum"` returns the sum over
tokens, which the step loop normalises over the whole optimizer step (`kd_token_loss_sum`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def forward_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Per-row `sum_v P_t(v) * (log P_t(v) - log P_s(v))`, rows of `[tokens, vocab]`."""
    teacher_logp = F.log_softmax(teacher_logits, dim=-1, dtype=torch.float32)
    student_logp = F.log_softmax(student_logits, dim=-1, dtype=torch.float32)
    teacher_p = teacher_logp.exp()
    # where the teacher gives a token no mass it adds nothing (0 * log 0 is taken as 0)
    log_ratio = torch.where(teacher_p > 0, teacher_logp - student_logp, 0.0)
    return (teacher_p * log_ratio).sum(dim=-1)


class KDLoss(nn.Module):
    """Temperature-scaled forward KL over label tokens, averaged (or summed) over them."""

    def __init__(
        self,
        ignore_index: int = -100,
        temperature: float = 1.0,
        fp32_upcast: bool = True,
        chunk_size: int = 0,
        reduction: str = "mean",
    ):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.ignore_index = ignore_index
        self.temperature = float(temperature)
        self.fp32_upcast = fp32_upcast
        self.chunk_size = int(chunk_size)
        self.reduction = reduction

    def forward(
        self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        valid = labels.reshape(-1) != self.ignore_index
        if not bool(valid.any()):  # keep the graph connected: every rank runs the backward
            return student_logits.sum() * 0.0
        vocab = student_logits.shape[-1]
        student = student_logits.reshape(-1, vocab)[valid]
        teacher = teacher_logits.reshape(-1, vocab)[valid].detach()
        chunks = zip(self._split(student), self._split(teacher), strict=True)
        per_token = torch.cat([self._chunk_kl(s, t) for s, t in chunks])
        total = per_token.sum() * self.temperature**2
        return total if self.reduction == "sum" else total / valid.sum()

    def _split(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Token chunks bound the fp32 `[tokens, vocab]` temporaries; 0 is one chunk."""
        return rows.split(self.chunk_size) if self.chunk_size > 0 else (rows,)

    def _chunk_kl(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        if self.fp32_upcast:
            student, teacher = student.float(), teacher.float()
        return forward_kl(teacher / self.temperature, student / self.temperature)


def kd_token_loss_sum(
    kd_fn: nn.Module,
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """The KD loss summed over label tokens, whatever reduction `kd_fn` was built with."""
    ignore_index = getattr(kd_fn, "ignore_index", -100)
    count = int((labels != ignore_index).sum())
    if count == 0:
        return student_logits.sum() * 0.0
    loss = kd_fn(student_logits, teacher_logits, labels)
    return loss * count if getattr(kd_fn, "reduction", "mean") == "mean" else loss
