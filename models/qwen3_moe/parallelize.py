"""Qwen3-MoE's parallel plan: Qwen3's plan (its q/k norms) plus expert parallelism.

FSDP units are the decoder layers, as for every dense family; FSDP2 shards the grouped
expert tensors and the fp32 router like any other parameter. Expert parallelism spreads
each `GroupedExperts` module's experts over a 1-D `ep` mesh (`shard_experts`, see
`expert_parallel.py`), and the returned DTensor parameters are the ones data parallelism
must leave alone; that part is `ExpertParallelMixin`, which other families whose MoE
blocks hold `GroupedExperts` (DeepSeek-V3) mix into their own plans. Sparse layers have no `mlp.{gate,up,down}_proj` linears, so the
tensor-parallel plan refuses them (a config whose layers are all dense is a Qwen3 stack and
gets Qwen3's plan); there is no tensor-parallel plan for the experts.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from models.common.wrappers import unwrap_model
from models.qwen3.parallelize import Qwen3ParallelPlan
from models.qwen3_moe.layers import GroupedExperts


def grouped_experts(model: nn.Module, kind: type[nn.Module] = GroupedExperts) -> list[nn.Module]:
    """Every grouped-experts module (of class `kind`) of the unwrapped model, in module order."""
    return [m for m in unwrap_model(model).modules() if isinstance(m, kind)]


class ExpertParallelMixin:
    """Expert parallelism for any plan whose MoE blocks hold `GroupedExperts` (Qwen3-MoE,
    DeepSeek-V3; gpt-oss sets `experts_class` to its own): mixed in before a `ParallelPlan`,
    whose refusal applies without experts."""

    experts_class: ClassVar[type[nn.Module]] = GroupedExperts

    def ep_unsupported_reason(self, model: nn.Module, ep_size: int) -> str | None:
        found = grouped_experts(model, self.experts_class)
        if not found:
            return super().ep_unsupported_reason(model, ep_size)
        counts = sorted({int(m.num_experts) for m in found})
        if any(count % ep_size for count in counts):
            return f"num_experts {counts[0]} is not divisible by ep_size {ep_size}"
        return None

    def apply_expert_parallel(self, model: nn.Module, ep_mesh: Any) -> list[nn.Parameter]:
        """Keep E/ep experts per rank; each local expert's gradient is that of the sum of
        all ep ranks' losses."""
        reason = self.ep_unsupported_reason(model, ep_mesh.size())
        if reason:
            raise ValueError(f"expert parallelism unavailable: {reason}")
        found = grouped_experts(model, self.experts_class)
        return [p for module in found for p in module.shard_experts(ep_mesh)]


class Qwen3MoeParallelPlan(ExpertParallelMixin, Qwen3ParallelPlan):
    """Qwen3's FSDP units and TP plan; experts spread over the `ep` mesh."""


QWEN3_MOE_PLAN = Qwen3MoeParallelPlan()
