"""gpt-oss's parallel plan: the common dense FSDP units plus expert parallelism.

FSDP units are the decoder layers; FSDP2 shards the grouped expert tensors, their biases,
the fp32 router and the attention sinks like any other parameter. Expert parallelism
spreads each `GptOssExperts` module's four `[num_experts, ...]` tensors over the 1-D `ep`
mesh through the shared grouped-expert machinery (`ExpertParallelMixin`), and the
returned DTensor parameters are the ones data parallelism must leave alone. Every layer is
sparse and its MLP has no `gate/up/down_proj` linears, so the common tensor-parallel plan
refuses the model; gpt-oss has no tensor-parallel plan.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from models.common.moe.parallelize import ExpertParallelMixin
from models.common.parallelize import ParallelPlan
from models.gpt_oss.layers import GptOssExperts


class GptOssParallelPlan(ExpertParallelMixin, ParallelPlan):
    """Dense FSDP units; experts spread over the `ep` mesh; no tensor parallelism."""

    experts_class: ClassVar[type[nn.Module]] = GptOssExperts


GPT_OSS_PLAN = GptOssParallelPlan()
