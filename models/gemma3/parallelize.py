"""Gemma 3's parallel plan: Gemma 2's (sandwich norms) plus the per-head q/k norms.

Gemma 3 normalises each head of q and k (`self_attn.q_norm`, `k_norm`) between the
projection and RoPE, as Qwen3 does: `QKNormPlanMixin` runs those norms as
`SequenceParallel` over the heads, so their weight gradients sum over the tp ranks.
"""

from __future__ import annotations

from models.common.parallelize import QKNormPlanMixin
from models.gemma2.parallelize import Gemma2ParallelPlan


class Gemma3ParallelPlan(QKNormPlanMixin, Gemma2ParallelPlan):
    """Sandwich norms (Gemma 2's plan) and q/k norms that reduce over the tp ranks."""


GEMMA3_PLAN = Gemma3ParallelPlan()
