"""DeepSeek-V3 state-dict adapter: per-expert Hugging Face tensors <-> native grouped experts.

The mapping is the grouped experts' (`models.common.moe.state_dict_adapter`), with the
expert count read from `n_routed_experts`. Point by point: the routed experts
`...mlp.experts.{e}.{gate,up,down}_proj.weight` stack, in expert-index order and without
transpose, reshape or dtype change, into `...mlp.experts.{gate,up,down}_proj`; the router
weight `mlp.gate.weight` and its correction bias `mlp.gate.e_score_correction_bias` keep
their own names and their fp32 dtype (two separate tensors, the bias a persistent buffer);
the shared experts `mlp.shared_experts.{gate,up,down}_proj.weight` are ordinary linears
under their own names and never mix with the routed ones; the first
`first_k_dense_replace` layers' dense `mlp.{gate,up,down}_proj` and all attention tensors
pass through. Missing, extra or misnumbered routed experts are refused. The shard-only
load stays off (`supports_low_memory_dcp_load = False`): expert targets are views into a
grouped parameter, and that path fills parameters only, not the correction-bias buffer.
"""

from __future__ import annotations

from typing import Any

from models.common.moe.state_dict_adapter import GroupedExpertsStateDictAdapter


class DeepseekV3StateDictAdapter(GroupedExpertsStateDictAdapter):
    """The grouped experts' stateless conversions over `config.n_routed_experts` experts."""

    supports_low_memory_dcp_load = False

    @staticmethod
    def expert_count(config: Any) -> int:
        return int(config.n_routed_experts)
