"""Mixtral state-dict adapter: the grouped experts' stacking plus Mixtral's checkpoint names.

Mixtral checkpoints name the MoE block `block_sparse_moe` and each expert's projections
`w1` (gate), `w3` (up) and `w2` (down): `model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight`
and the router `model.layers.{i}.block_sparse_moe.gate.weight`. Native modules use the
names of the shared MoE block (`mlp.gate`, `mlp.experts.{gate,up,down}_proj`, see
`models.common.moe.layers`). This adapter renames keys on the way in and out and otherwise
is `GroupedExpertsStateDictAdapter`: per-expert tensors stacked in expert order, views on the way
out, write-through load targets, refusal of missing or misnumbered experts.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from models.common.moe.state_dict_adapter import GroupedExpertsStateDictAdapter

_NATIVE_TO_HF_PROJ = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_HF_TO_NATIVE_PROJ = {hf: native for native, hf in _NATIVE_TO_HF_PROJ.items()}
_NATIVE_MOE_KEY = re.compile(
    r"^(?P<prefix>.*)\.mlp\.(?:(?P<gate>gate\.weight)|"
    r"experts\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight)$"
)
_HF_MOE_KEY = re.compile(
    r"^(?P<prefix>.*)\.block_sparse_moe\.(?:(?P<gate>gate\.weight)|"
    r"experts\.(?P<expert>\d+)\.(?P<proj>w1|w2|w3)\.weight)$"
)


def native_key_to_hf(key: str) -> str:
    """`...mlp.experts.3.up_proj.weight` -> `...block_sparse_moe.experts.3.w3.weight`."""
    return _rename_moe_key(key, _NATIVE_MOE_KEY, "block_sparse_moe", _NATIVE_TO_HF_PROJ)


def hf_key_to_native(key: str) -> str:
    """The inverse of `native_key_to_hf` (other keys pass through)."""
    return _rename_moe_key(key, _HF_MOE_KEY, "mlp", _HF_TO_NATIVE_PROJ)


def _rename_moe_key(key: str, pattern: re.Pattern, block: str, projections: dict) -> str:
    """A router or expert key matched by `pattern`, renamed under `block` with the expert's
    projection renamed by `projections`; any other key as it is."""
    match = pattern.match(key)
    if match is None:
        return key
    if match["gate"]:
        return f"{match['prefix']}.{block}.gate.weight"
    proj = projections[match["proj"]]
    return f"{match['prefix']}.{block}.experts.{match['expert']}.{proj}.weight"


class MixtralStateDictAdapter(GroupedExpertsStateDictAdapter):
    """The grouped experts' conversions with Mixtral's `block_sparse_moe` / `w1,w2,w3` key names."""

    @classmethod
    def convert_single_tensor_to_hf(cls, fqn: str, tensor: torch.Tensor) -> list[tuple[str, Any]]:
        pairs = super().convert_single_tensor_to_hf(fqn, tensor)
        return [(native_key_to_hf(key), value) for key, value in pairs]

    @classmethod
    def to_hf(cls, state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        return {native_key_to_hf(k): v for k, v in super().to_hf(state, config).items()}

    @classmethod
    def from_hf(cls, hf_state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        return super().from_hf({hf_key_to_native(k): v for k, v in hf_state.items()}, config)

    @classmethod
    def hf_targets(cls, params: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        return {native_key_to_hf(k): v for k, v in super().hf_targets(params, config).items()}
