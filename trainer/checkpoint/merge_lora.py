"""LoRA merged into its base, tensor by tensor, as `peft`'s `merge_and_unload` computes it.

`AdapterWeights.read` takes a PEFT adapter directory (`adapter_config.json` +
`adapter_model.safetensors`) and groups its tensors by the base module they adapt. For a
linear module `W' = W + s * B @ A`, with `s = alpha / r` (`alpha / sqrt(r)` under rsLoRA,
per-module `rank_pattern` / `alpha_pattern` honoured); an embedding's delta is `(B @ A)^T`;
DoRA rescales each output row: `W' = m / ||W + s B A||_row * (W + s B A)`. Tensors the
adapter saves whole (`modules_to_save`, trained biases) replace the base's. The math runs
in float32 whatever the stored dtypes; the caller casts the result. What cannot be merged
exactly is refused with `MergeRefused` (DoRA on an embedding, Conv1D `fan_in_fan_out`
layers, an adapter module the base does not have), never approximated.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.common.safetensors_io import read_tensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_LORA_PARTS = {
    "lora_A.weight": "A",
    "lora_B.weight": "B",
    "lora_embedding_A": "A",
    "lora_embedding_B": "B",
    "lora_magnitude_vector": "magnitude",
}


class MergeRefused(ValueError):
    """An adapter that cannot be merged exactly; the message says what and why."""


@dataclass
class ModuleDelta:
    """One adapted module's LoRA tensors and its scale."""

    A: torch.Tensor | None = None
    B: torch.Tensor | None = None
    magnitude: torch.Tensor | None = None
    embedding: bool = False
    scale: float = 1.0


@dataclass
class AdapterWeights:
    """An adapter's deltas by base weight name (`<module>.weight`) and its whole tensors."""

    deltas: dict[str, ModuleDelta] = field(default_factory=dict)
    replacements: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, directory: Path) -> AdapterWeights:
        config = json.loads((directory / ADAPTER_CONFIG).read_text())
        if config.get("fan_in_fan_out"):
            raise MergeRefused(
                "adapter_config.json: fan_in_fan_out (Conv1D layers) is not supported by the "
                "merged export; export the adapter alone (merge_lora: false)"
            )
        weights = cls(config=config)
        for name, tensor in read_tensors(directory / ADAPTER_WEIGHTS):
            weights._add(name, tensor)
        for module, delta in weights.deltas.items():
            _check_complete(module, delta)
            delta.scale = module_scale(config, module.removesuffix(".weight"), delta)
        return weights

    def _add(self, name: str, tensor: torch.Tensor) -> None:
        short = name.removeprefix(_PREFIX)
        for suffix, part in _LORA_PARTS.items():
            if short.endswith("." + suffix):
                module = short[: -len(suffix) - 1]
                delta = self.deltas.setdefault(module + ".weight", ModuleDelta())
                setattr(delta, part, tensor)
                delta.embedding = delta.embedding or suffix.startswith("lora_embedding")
                return
        if ".lora_" in short:
            raise MergeRefused(f"{ADAPTER_WEIGHTS}: tensor {name} is no LoRA part this merge knows")
        self.replacements[short] = tensor

    def unused(self, base_names: set[str]) -> list[str]:
        """Adapter entries that name no tensor of the base (a mismatched base)."""
        return sorted((set(self.deltas) | set(self.replacements)) - base_names)


def _check_complete(module: str, delta: ModuleDelta) -> None:
    if delta.A is None or delta.B is None:
        raise MergeRefused(f"{ADAPTER_WEIGHTS}: {module} has lora_A or lora_B missing")
    if delta.magnitude is not None and delta.embedding:
        raise MergeRefused(
            f"{module}: DoRA on an embedding is not supported by the merged export; "
            "export the adapter alone (merge_lora: false)"
        )


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """peft's rule: a pattern key matches a module name that ends with it at a dot."""
    for key, value in (patterns or {}).items():
        if re.fullmatch(rf"(.*\.)?{key}", module):
            return value
    return default


def module_scale(config: dict[str, Any], module: str, delta: ModuleDelta) -> float:
    """`alpha / r` for `module` (`alpha / sqrt(r)` with rsLoRA), patterns honoured."""
    rank = int(_pattern_value(config.get("rank_pattern") or {}, module, config["r"]))
    alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"]))
    assert delta.A is not None
    if delta.A.shape[0] != rank:
        raise MergeRefused(
            f"{module}: lora_A has rank {delta.A.shape[0]} but adapter_config.json says {rank}"
        )
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def merged_weight(weight: torch.Tensor, delta: ModuleDelta) -> torch.Tensor:
    """The base `weight` with `delta` folded in, in float32."""
    assert delta.A is not None and delta.B is not None
    base = weight.to(torch.float32)
    update = delta.B.to(torch.float32) @ delta.A.to(torch.float32)
    if delta.embedding:
        update = update.T
    if update.shape != base.shape:
        raise MergeRefused(
            f"the adapter's update has shape {tuple(update.shape)} but the base weight has "
            f"{tuple(base.shape)}: the adapter was trained on another base"
        )
    combined = base + delta.scale * update
    if delta.magnitude is None:
        return combined
    norm = torch.linalg.norm(combined, dim=1)
    return (delta.magnitude.to(torch.float32) / norm).view(-1, 1) * combined
