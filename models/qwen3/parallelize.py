"""Qwen3's parallel plan: the common dense plan plus its per-head q/k RMSNorms.

Qwen3 normalises each head of q and k (`self_attn.q_norm`, `k_norm`, one `head_dim` weight
shared by all heads) between the projection and RoPE, on a (batch, seq, heads, head_dim)
view. With q/k_proj colwise-sharded a rank holds only its local heads there, so a plain
replicated norm would compute the right outputs but only its own heads' share of the weight
gradient. The norms therefore run as `SequenceParallel` over the heads dimension (dim 2): the
weight is a replicated DTensor and the input is marked sharded on heads, so autograd sums
the weight gradient over the tensor-parallel ranks. Everything else is the dense plan.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from models.common.parallelize import ParallelPlan

_HEADS_DIM = 2  # q/k are viewed as (batch, seq, heads, head_dim) when normalised


class Qwen3ParallelPlan(ParallelPlan):
    """Dense plan whose q/k norms reduce their weight gradients over the tp ranks."""

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


QWEN3_PLAN = Qwen3ParallelPlan()
