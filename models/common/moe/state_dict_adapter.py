"""Grouped experts' state-dict adapter: Hugging Face per-expert tensors <-> grouped tensors.

Hugging Face checkpoints hold `...mlp.experts.{e}.{gate,up,down}_proj.weight`, one 2-D
tensor per expert; the grouped layout keeps `...mlp.experts.{gate,up,down}_proj`, the same
tensors stacked on a new leading expert dimension in expert-index order (no transpose, no
dtype change). Everything else (attention, norms, router `mlp.gate.weight`, dense MLPs)
has the same name on both sides. `from_hf` refuses missing, extra or misnumbered experts;
`to_hf` and the load targets are views (no copies), which is why loading writes each
checkpoint tensor straight into the grouped parameter (`supports_low_memory_load`), unless
parameters are already sharded DTensors. The expert count is `config.num_experts`;
families whose config names it otherwise, or whose checkpoints name the keys otherwise,
subclass the adapter.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

from models.common.moe import lora

_NATIVE_KEY = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate_proj|up_proj|down_proj)$")
_HF_KEY = re.compile(
    r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


class ExpertMappingError(KeyError):
    """A state dict whose expert tensors do not map one-to-one onto the native layout."""


class GroupedExpertsStateDictAdapter:
    """Stateless conversions; `config.num_experts` fixes how many experts each layer has."""

    # Per-expert targets are views into a grouped parameter: once it is a sharded DTensor
    # they are no longer its storage, so the shard-only load keeps the full-model path.
    supports_low_memory_dcp_load = False

    @staticmethod
    def expert_count(config: Any) -> int:
        """Routed experts per sparse layer (families whose config names it otherwise override)."""
        return config.num_experts

    @staticmethod
    def convert_single_tensor_to_hf(fqn: str, tensor: torch.Tensor) -> list[tuple[str, Any]]:
        """One native tensor -> its Hugging Face (key, tensor) pairs (views for experts)."""
        match = _NATIVE_KEY.match(fqn)
        if match is None:
            return [(fqn, tensor)]
        prefix, proj = match["prefix"], match["proj"]
        return [(f"{prefix}.{e}.{proj}.weight", tensor[e]) for e in range(tensor.shape[0])]

    @classmethod
    def to_hf(cls, state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for fqn, tensor in state.items():
            match = _NATIVE_KEY.match(fqn)
            if match and tensor.shape[0] != cls.expert_count(config):
                raise ExpertMappingError(
                    f"{fqn} has {tensor.shape[0]} experts, config says {cls.expert_count(config)}"
                )
            out.update(cls.convert_single_tensor_to_hf(fqn, tensor))
        return out

    @classmethod
    def from_hf(cls, hf_state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Stack per-expert tensors in expert-index order; pass other keys through."""
        native: dict[str, torch.Tensor] = {}
        groups: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for key, tensor in hf_state.items():
            match = _HF_KEY.match(key)
            if match is None:
                native[key] = tensor
                continue
            group = groups.setdefault((match["prefix"], match["proj"]), {})
            group[int(match["expert"])] = tensor
        for (prefix, proj), experts in groups.items():
            expected = set(range(cls.expert_count(config)))
            if set(experts) != expected:
                raise ExpertMappingError(
                    f"{prefix}.*.{proj}: experts {sorted(experts)} do not match "
                    f"0..{len(expected) - 1} (missing {sorted(expected - set(experts))})"
                )
            native[f"{prefix}.{proj}"] = torch.stack([experts[e] for e in range(len(experts))])
        return native

    @classmethod
    def hf_targets(cls, params: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Checkpoint key -> destination view inside the native parameter (write-through)."""
        targets: dict[str, torch.Tensor] = {}
        for fqn, param in params.items():
            match = _NATIVE_KEY.match(fqn)
            if match is None:
                targets[fqn] = param
                continue
            for e in range(cls.expert_count(config)):
                targets[f"{match['prefix']}.{e}.{match['proj']}.weight"] = param.data[e]
        return targets

    @classmethod
    def lora_to_hf(
        cls, state: dict[str, torch.Tensor], peft_config: Any, config: Any
    ) -> tuple[dict[str, torch.Tensor], Any]:
        """A LoRA adapter with expert adapters (`models.common.moe.lora`) in peft's
        per-expert layout; its config (a copy) also targets every expert projection, at
        the experts' rank where it differs (`peft.moe_rank_scaling`)."""
        ranks = {int(t.shape[1]) for k, t in state.items() if k.endswith(".lora_gate_up_A")}
        if not ranks:
            return state, peft_config
        peft_config = copy.copy(peft_config)
        peft_config.target_modules = lora.expert_lora_targets(peft_config.target_modules)
        (rank,) = ranks
        if rank != peft_config.r:
            pattern = {r"experts\.\d+\.(?:gate_proj|up_proj|down_proj)": rank}
            peft_config.rank_pattern = {**(peft_config.rank_pattern or {}), **pattern}
        return lora.lora_to_hf(state), peft_config

    @classmethod
    def lora_from_hf(cls, state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """The inverse of `lora_to_hf` (tensors only)."""
        return lora.lora_from_hf(state, cls.expert_count(config))

    @staticmethod
    def supports_low_memory_load(model: torch.nn.Module) -> bool:
        """True when every load target is a view of the final storage (no DTensor shards)."""
        from torch.distributed.tensor import DTensor

        return not any(isinstance(p, DTensor) for p in model.parameters())
