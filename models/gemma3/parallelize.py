"""Gemma 3's parallel plan: Gemma 2's (sandwich norms) plus Qwen3's per-head q/k norms.

Gemma 3 normalises each head of q and k on a (batch, seq, heads, head_dim) view, exactly
where Qwen3 does, so the q/k norms run as `SequenceParallel` over the heads dimension and
their weight gradients are summed over the tensor-parallel ranks (`Qwen3ParallelPlan`).
The method resolution order applies both additions to the common dense plan.
"""

from __future__ import annotations

from models.gemma2.parallelize import Gemma2ParallelPlan
from models.qwen3.parallelize import Qwen3ParallelPlan


class Gemma3ParallelPlan(Gemma2ParallelPlan, Qwen3ParallelPlan):
    """Sandwich norms (Gemma 2) and per-head q/k norms (Qwen3) on the dense plan."""


GEMMA3_PLAN = Gemma3ParallelPlan()
