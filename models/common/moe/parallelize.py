"""Expert parallelism in a parallel plan: find the grouped experts and spread them over `ep`.

`ExpertParallelMixin`, mixed in before a family's `ParallelPlan`, refuses expert
parallelism when an expert count is not divisible by `ep_size` and otherwise has each
grouped-experts module keep E/ep experts of the 1-D `ep` mesh (`shard_experts`, see
`expert_parallel.py`); it returns the DTensor parameters, which data parallelism leaves
alone (ep == dp) or shards only over the ranks holding the same experts. A model without
grouped experts gets the plan's own refusal. Experts are found by type (`experts_class`:
`GroupedExperts` unless a family has its own), never by method.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from models.common.moe.layers import GroupedExperts
from models.common.wrappers import unwrap_model


def grouped_experts(model: nn.Module, kind: type[nn.Module] = GroupedExperts) -> list[nn.Module]:
    """Every grouped-experts module (of class `kind`) of the unwrapped model, in module order."""
    return [m for m in unwrap_model(model).modules() if isinstance(m, kind)]


class ExpertParallelMixin:
    """Expert parallelism for any plan whose MoE blocks hold `GroupedExperts` (or the
    family's `experts_class`): mixed in before a `ParallelPlan`, whose refusal applies
    without experts."""

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
