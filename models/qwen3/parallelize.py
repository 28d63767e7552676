"""Qwen3's parallel plan: the common dense plan plus its per-head q/k RMSNorms.

Qwen3 normalises each head of q and k (`self_attn.q_norm`, `k_norm`) between the projection
and RoPE; `QKNormPlanMixin` runs those norms as `SequenceParallel` over the heads, so their
weight gradients sum over the tensor-parallel ranks. Everything else is the dense plan.
"""

from __future__ import annotations

from models.common.parallelize import ParallelPlan, QKNormPlanMixin


class Qwen3ParallelPlan(QKNormPlanMixin, ParallelPlan):
    """Dense plan whose q/k norms reduce their weight gradients over the tp ranks."""


QWEN3_PLAN = Qwen3ParallelPlan()
