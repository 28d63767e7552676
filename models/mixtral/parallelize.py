"""Mixtral's parallel plan: the common dense plan's FSDP units plus expert parallelism.

FSDP units are the decoder layers; FSDP2 shards the grouped experts and the fp32 router
like any other parameter. Expert parallelism spreads each layer's `GroupedExperts` over the
1-D `ep` mesh (`ExpertParallelMixin`, shared by the MoE families). Every Mixtral layer is
sparse, so the tensor-parallel plan refuses it (its layers have no
`mlp.{gate,up,down}_proj` linears); there is no tensor-parallel plan for the experts.
"""

from __future__ import annotations

from models.common.moe.parallelize import ExpertParallelMixin
from models.common.parallelize import ParallelPlan


class MixtralParallelPlan(ExpertParallelMixin, ParallelPlan):
    """The dense plan's FSDP units and TP refusals; experts spread over the `ep` mesh."""


MIXTRAL_PLAN = MixtralParallelPlan()
