"""Qwen3-MoE's parallel plan: Qwen3's plan (its q/k norms) plus expert parallelism.

FSDP units are the decoder layers, as for every dense family; FSDP2 shards the grouped
expert tensors and the router like any other parameter (in a bf16 model the router, kept
fp32, is an FSDP2 group of its own: the trainer splits groups by dtype). Expert
parallelism spreads each `GroupedExperts` module's experts over a 1-D `ep` mesh
(`ExpertParallelMixin`). Sparse layers have no `mlp.{gate,up,down}_proj` linears, so the
tensor-parallel plan refuses them (a config whose layers are all dense is a Qwen3 stack
and gets Qwen3's plan); there is no tensor-parallel plan for the experts.
"""

from __future__ import annotations

from models.common.moe.parallelize import ExpertParallelMixin
from models.qwen3.parallelize import Qwen3ParallelPlan


class Qwen3MoeParallelPlan(ExpertParallelMixin, Qwen3ParallelPlan):
    """Qwen3's FSDP units and TP plan; experts spread over the `ep` mesh."""


QWEN3_MOE_PLAN = Qwen3MoeParallelPlan()
