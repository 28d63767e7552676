"""Phi-3's parallel plan: the common dense plan, refused while residual dropout is on.

Native Phi-3 keeps q/k/v and gate/up as separate projections, so the common dense plan
shards it as it shards Llama. Its residual dropout (`resid_pdrop`) is the one difference:
under tensor parallelism the block outputs it drops are replicated (or, with sequence
parallelism, sharded) across the tp ranks, and each rank would draw its own mask, so the
ranks' copies would disagree. The plan therefore refuses tensor parallelism for configs
with `resid_pdrop` > 0 (the recipe contract refuses the same at submit).
"""

from __future__ import annotations

from torch import nn

from models.common.parallelize import ParallelPlan
from models.common.wrappers import unwrap_model
from models.phi3.layers import residual_dropout_rate


class Phi3ParallelPlan(ParallelPlan):
    """Dense plan that refuses tensor parallelism while residual dropout is on."""

    def tp_unsupported_reason(self, model: nn.Module, tp_size: int | None = None) -> str | None:
        config = getattr(unwrap_model(model), "config", None)
        rate = residual_dropout_rate(config) if config is not None else 0.0
        if rate:
            return (
                f"resid_pdrop {rate}: tensor-parallel ranks would drop different elements of "
                "the activations they share; set resid_pdrop: 0.0 or tp_size: 1"
            )
        return super().tp_unsupported_reason(model, tp_size)


PHI3_PLAN = Phi3ParallelPlan()
