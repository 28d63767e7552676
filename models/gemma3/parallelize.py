"""Gemma 3's parallel plan: Gemma 2's (sandwich norms) plus the per-head q/k norms.

Gemma 3 normalises each head of q and k (`self_attn.q_norm`, `k_norm`, one `head_dim`
weight shared by all heads) on a (batch, seq, heads, head_dim) view between the
projection and RoPE. With q/k_proj colwise-sharded a rank holds only its local heads
there, so a plain replicated norm would get only its own heads' share of the weight
gradient. The norms therefore run as `SequenceParallel` over the heads dimension: the
weight is a replicated DTensor and autograd sums its gradient over the tensor-parallel
ranks (as the Qwen3 plan does for its norms).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from models.gemma2.parallelize import Gemma2ParallelPlan

_HEADS_DIM = 2  # q/k are viewed as (batch, seq, heads, head_dim) when normalised


class Gemma3ParallelPlan(Gemma2ParallelPlan):
    """Sandwich norms (Gemma 2's plan) and q/k norms that reduce over the tp ranks."""

    shards_qk_norm: ClassVar[bool] = True

    def tp_plan(self, model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
        from torch.distributed.tensor.parallel import SequenceParallel

        plan = super().tp_plan(model, sequence_parallel)
        layer = self.layer_pattern(model)
        for name in ("q_norm", "k_norm"):
            plan[f"{layer}.self_attn.{name}"] = SequenceParallel(
                sequence_dim=_HEADS_DIM, use_local_output=True
            )
        return plan


GEMMA3_PLAN = Gemma3ParallelPlan()
