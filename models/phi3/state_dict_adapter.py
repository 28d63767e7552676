"""Phi-3 state-dict adapter: Hugging Face fused projections <-> native separate ones.

Hugging Face Phi-3 checkpoints hold `self_attn.qkv_proj.weight` (q, k and v rows stacked,
in that order) and `mlp.gate_up_proj.weight` (gate rows, then up rows); native keeps
`q_proj`/`k_proj`/`v_proj` and `gate_proj`/`up_proj`, so the common dense tensor-parallel
plan shards them. Every other key has the same name and layout on both sides. Splitting is
along rows only (no transpose, no dtype change) and each fused tensor's shape is checked
against the config first, so a mismatched checkpoint raises instead of being reshaped.

Loading reads each part's row range of the fused tensor straight into its parameter
(`read_plan`: the rows of a row-major tensor are one contiguous byte range, so nothing is
staged). Saving builds each fused tensor only when it is written (`iter_hf`), so at most
one exists at a time. The shard-only load cannot split one checkpoint tensor over three
sharded parameters, so `supports_low_memory_dcp_load` is False (the full load is used).
LoRA adapters trained on the native split projections are fused the same way for
transformers' Phi-3 (`fuse_lora_adapter`, explained above it).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from models.common.rope import head_dim_of
from models.common.safetensors_io import CheckpointError, TensorEntry, TensorSpec

_HF_KEY = re.compile(r"^(?P<prefix>.*\.)(?P<fused>self_attn\.qkv_proj|mlp\.gate_up_proj)\.weight$")
_NATIVE_KEY = re.compile(
    r"^(?P<prefix>.*\.)(?P<block>self_attn|mlp)\.(?P<part>q_proj|k_proj|v_proj|gate_proj|up_proj)"
    r"\.weight$"
)
_PARTS = {
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
}
_FUSED_OF = {part: fused for fused, parts in _PARTS.items() for part in parts}


class FusedMappingError(KeyError):
    """A state dict whose fused projections do not map one-to-one onto the native ones."""


def part_rows(config: Any) -> dict[str, dict[str, int]]:
    """Fused name -> {part: rows}, in the order the parts are stacked."""
    dim = head_dim_of(config)
    kv = config.num_key_value_heads * dim
    inter = config.intermediate_size
    return {
        "self_attn.qkv_proj": {
            "q_proj": config.num_attention_heads * dim,
            "k_proj": kv,
            "v_proj": kv,
        },
        "mlp.gate_up_proj": {"gate_proj": inter, "up_proj": inter},
    }


def _check_fused_shape(key: str, fused: str, shape: tuple[int, ...], config: Any) -> None:
    rows = sum(part_rows(config)[fused].values())
    expected = (rows, config.hidden_size)
    if tuple(shape) != expected:
        raise CheckpointError(
            f"{key}: fused shape {tuple(shape)} != {expected} expected from the config "
            f"({' + '.join(f'{p} {r}' for p, r in part_rows(config)[fused].items())} rows); "
            "the checkpoint was saved with a different config"
        )


def hf_key_of(fqn: str) -> str:
    """The HF key a native name converts to (a split part: its fused tensor's key)."""
    match = _NATIVE_KEY.match(fqn)
    return f"{match['prefix']}{_FUSED_OF[match['part']]}.weight" if match else fqn


def _native_groups(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """HF fused key -> {part: native tensor} for every split projection in `state`."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for fqn, tensor in state.items():
        match = _NATIVE_KEY.match(fqn)
        if match:
            groups.setdefault(hf_key_of(fqn), {})[match["part"]] = tensor
    return groups


# --- LoRA adapters ---------------------------------------------------------------------------
# Phi-3 LoRA adapters in transformers' layout: split-projection adapters fused exactly.
#
# Native Phi-3 trains LoRA on `q_proj`/`k_proj`/`v_proj` and `gate_proj`/`up_proj`;
# transformers' Phi-3 has only `qkv_proj` and `gate_up_proj`. A fused projection's update is
# the parts' updates stacked by rows: [B_q A_q; B_k A_k; B_v A_v] = blockdiag(B_q, B_k, B_v)
# @ cat(A_q, A_k, A_v). So the fused adapter has rank n*r (n = the parts) with A the parts'
# A matrices stacked, B block-diagonal (zero rows for a part that was not adapted, which
# then stays untouched), and `lora_alpha` n*alpha so that alpha / rank, the scale applied
# to B A, is unchanged. The adapter config names every adapted module by its full path, so
# PEFT adapts exactly those. DoRA's per-output-row magnitudes stack the same way, but a part
# left unadapted would need its weight's row norms, so DoRA must adapt every part or none.

_LORA_KEY = re.compile(
    r"^(?P<module>.*\.(?P<part>q_proj|k_proj|v_proj|gate_proj|up_proj))"
    r"\.(?P<kind>lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
)
_ANY_LORA_KEY = re.compile(
    r"^(?P<module>.*)\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
)


def _fused_name(module: str) -> str:
    return hf_key_of(f"{module}.weight").removesuffix(".weight")


def _grouped(state: dict[str, torch.Tensor]) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """Fused module -> part -> {lora_A.weight, lora_B.weight[, lora_magnitude_vector]}."""
    groups: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for key, tensor in state.items():
        match = _LORA_KEY.match(key)
        if match:
            parts = groups.setdefault(_fused_name(match["module"]), {})
            parts.setdefault(match["part"], {})[match["kind"]] = tensor
    return groups


def _fuse_group(
    fused: str, parts: dict[str, dict[str, torch.Tensor]], rows: dict[str, int], rank: int
) -> dict[str, torch.Tensor]:
    """The fused module's adapter tensors from its adapted parts (rows: every part's)."""
    adapted = [p for p in rows if p in parts]
    dora = any("lora_magnitude_vector" in parts[p] for p in adapted)
    if dora and len(adapted) != len(rows):
        raise FusedMappingError(
            f"{fused}: DoRA adapted {adapted} only; fusing needs every part of {list(rows)} "
            "(an unadapted part's magnitude is its weight's row norms)"
        )
    a = torch.cat([parts[p]["lora_A.weight"] for p in adapted])
    b = a.new_zeros(sum(rows.values()), rank * len(adapted))
    row = 0
    for part, count in rows.items():
        if part in parts:
            col = adapted.index(part) * rank
            b[row : row + count, col : col + rank] = parts[part]["lora_B.weight"]
        row += count
    out = {f"{fused}.lora_A.weight": a, f"{fused}.lora_B.weight": b}
    if dora:
        magnitudes = [parts[p]["lora_magnitude_vector"] for p in adapted]
        out[f"{fused}.lora_magnitude_vector"] = torch.cat(magnitudes)
    return out


def _target_modules(state: dict[str, torch.Tensor], prefix: str) -> list[str]:
    """Every adapted module's path below the PEFT wrapper ("model.layers.0.self_attn...")."""
    modules = {m["module"] for key in state if (m := _ANY_LORA_KEY.match(key))}
    return sorted(m.removeprefix(prefix) for m in modules)


def fuse_lora_adapter(
    state: dict[str, torch.Tensor], peft_config: Any, config: Any
) -> tuple[dict[str, torch.Tensor], Any]:
    """(adapter tensors, adapter config) for transformers' fused Phi-3, as a copy."""
    if getattr(peft_config, "use_rslora", False):
        raise FusedMappingError("rsLoRA adapters cannot be fused (its scale is alpha/sqrt(r))")
    rank, alpha = int(peft_config.r), float(peft_config.lora_alpha)
    if peft_config.rank_pattern or peft_config.alpha_pattern:
        raise FusedMappingError("adapters with rank_pattern/alpha_pattern cannot be fused")
    out = {k: v for k, v in state.items() if not _LORA_KEY.match(k)}
    ranks, alphas = {}, {}
    for fused, parts in _grouped(state).items():
        rows = part_rows(config)[".".join(fused.split(".")[-2:])]
        out.update(_fuse_group(fused, parts, rows, rank))
        adapted = sum(1 for p in rows if p in parts)
        name = fused.removeprefix("base_model.model.")
        ranks[name], alphas[name] = rank * adapted, alpha * adapted
    fused_config = copy.copy(peft_config)
    fused_config.target_modules = _target_modules(out, "base_model.model.")
    fused_config.exclude_modules = None
    fused_config.rank_pattern, fused_config.alpha_pattern = ranks, alphas
    return out, fused_config


class Phi3StateDictAdapter:
    """Stateless conversions; the config fixes how many rows each part has."""

    supports_low_memory_dcp_load = False

    @staticmethod
    def from_hf(hf_state: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Split fused tensors into row views (no copies); pass other keys through."""
        native: dict[str, torch.Tensor] = {}
        for key, tensor in hf_state.items():
            match = _HF_KEY.match(key)
            if match is None:
                native[key] = tensor
                continue
            _check_fused_shape(key, match["fused"], tuple(tensor.shape), config)
            rows = part_rows(config)[match["fused"]]
            block = match["fused"].split(".")[0]
            for part, piece in zip(rows, tensor.split(list(rows.values())), strict=True):
                native[f"{match['prefix']}{block}.{part}.weight"] = piece
        return native

    @classmethod
    def to_hf(cls, state: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Fuse split projections (one new tensor each); pass other keys through."""
        return dict(cls.iter_hf(state, config))

    @classmethod
    def iter_hf(
        cls, state: Mapping[str, torch.Tensor], config: Any
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF key, tensor) in native order; each fused tensor is built only when reached."""
        groups = _native_groups(state)
        for name in cls.hf_names(state):
            if name in groups:
                yield name, cls.fuse(name, groups[name], config)
            else:
                yield name, state[name]

    @staticmethod
    def hf_names(state: Mapping[str, Any]) -> list[str]:
        """The HF keys `state` converts to, each once, at its first part's position."""
        return list(dict.fromkeys(hf_key_of(fqn) for fqn in state))

    @staticmethod
    def fuse(key: str, parts: Mapping[str, torch.Tensor], config: Any) -> torch.Tensor:
        """One fused tensor from all of its parts, each checked against the config."""
        fused = _HF_KEY.match(key)["fused"]
        rows = part_rows(config)[fused]
        if set(parts) != set(rows):
            raise FusedMappingError(
                f"{key}: needs parts {sorted(rows)}, got {sorted(parts)} "
                f"(missing {sorted(set(rows) - set(parts))})"
            )
        for part, count in rows.items():
            if tuple(parts[part].shape) != (count, config.hidden_size):
                raise FusedMappingError(
                    f"{key}: {part} has shape {tuple(parts[part].shape)}, "
                    f"config says {(count, config.hidden_size)}"
                )
        return torch.cat([parts[part] for part in rows])

    @classmethod
    def hf_entries(cls, state: Mapping[str, torch.Tensor], config: Any) -> list[TensorEntry]:
        """The HF tensors' names, dtypes and shapes, without building any of them."""
        meta = {
            k: torch.empty(tuple(v.shape), dtype=v.dtype, device="meta") for k, v in state.items()
        }
        return [TensorEntry.of(name, tensor) for name, tensor in cls.iter_hf(meta, config)]

    @classmethod
    def read_plan(
        cls,
        params: Mapping[str, torch.Tensor],
        config: Any,
        specs: dict[str, TensorSpec],
    ) -> list[tuple[str, torch.Tensor]]:
        """(spec name, destination parameter) pairs that fill every parameter from `specs`.

        A fused tensor's parts become sub-specs of its row ranges, added to `specs` under
        "KEY[start:end]", so the reader writes their bytes straight into each parameter.
        """
        plan: list[tuple[str, torch.Tensor]] = []
        groups = _native_groups(params)
        for name in cls.hf_names(params):
            if name not in groups:
                plan.append((name, params[name]))
                continue
            fused = _HF_KEY.match(name)["fused"]
            spec = specs[name]
            _check_fused_shape(name, fused, spec.shape, config)
            row_bytes = spec.shape[1] * spec.dtype.itemsize
            start = 0
            for part, rows in part_rows(config)[fused].items():
                sub = dataclasses.replace(
                    spec,
                    name=f"{name}[{start}:{start + rows}]",
                    shape=(rows, spec.shape[1]),
                    start=spec.start + start * row_bytes,
                    end=spec.start + (start + rows) * row_bytes,
                )
                specs[sub.name] = sub
                plan.append((sub.name, groups[name][part]))
                start += rows
        return plan

    @staticmethod
    def conversion_groups(names: list[str]) -> list[tuple[str, ...]]:
        """Native names grouped by the HF tensor they make (consolidation gathers a group,
        then fuses it); each group sits at its first part's position."""
        groups: dict[str, list[str]] = {}
        for fqn in names:
            groups.setdefault(hf_key_of(fqn), []).append(fqn)
        return [tuple(group) for group in groups.values()]

    @staticmethod
    def hf_targets(params: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Refused: a fused key has no single destination tensor (see `read_plan`)."""
        raise FusedMappingError(
            "Phi-3's fused qkv_proj/gate_up_proj feed several parameters each; load with "
            "Phi3ForCausalLM.load_hf_weights (read_plan), not per-key targets"
        )

    @staticmethod
    def lora_to_hf(
        state: dict[str, torch.Tensor], peft_config: Any, config: Any
    ) -> tuple[dict[str, torch.Tensor], Any]:
        """A LoRA adapter's tensors and config for transformers' fused Phi-3."""
        return fuse_lora_adapter(state, peft_config, config)

    @classmethod
    def convert_single_tensor_to_hf(cls, fqn: str, tensor: torch.Tensor) -> list[tuple[str, Any]]:
        """Unfused tensors keep their name; a split part has no HF tensor of its own (use
        `conversion_groups` and `to_hf`)."""
        if _NATIVE_KEY.match(fqn):
            raise FusedMappingError(
                f"{fqn} is one part of a fused Hugging Face tensor; convert its whole group "
                "with to_hf (or iter_hf)"
            )
        return [(fqn, tensor)]
