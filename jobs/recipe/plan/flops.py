"""Parameter counts and training FLOPs per token from a model config, torch-free.

Each native family lists its weights from the config alone (`family_weights`, keyed by the
registry row's `family`): every tensor's shape, how many the model holds, and how many of
them one token passes through (for MoE, the routed experts it visits). From that list come
the exact parameter count the native class builds (`param_count`, tested against
`sum(p.numel())` for every registered family), the LoRA adapter sizes (`lora_params`) and
the FLOPs per token behind MFU and the plan's time estimate (`model_flops_per_token`).
Architectures without a native class are counted as Llama-style (config arithmetic). Layers
that differ (a per-layer `head_dim`, heads, kv heads, MLP width or sliding window: Gemma-4's
wider full-attention heads) are counted layer by layer, from a config.json's
`per_layer_config` or a transformers config whose per-layer fields raise on a global read
(`jobs.recipe.plan.config_fields`). A config past the maxima of `jobs.recipe.load.limits` (its sizes, its parameter count) is
refused with a ValueError: no count, as for a config that lacks the sizes.
Validation imports this module without torch; it reads a transformers config or the same
fields as a plain dict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.recipe.load.limits import MAX_PARAM_COUNT
from jobs.recipe.model.lora_targets import lora_targets, selects
from jobs.recipe.plan.config_fields import cfg, layer_overrides, readable
from jobs.recipe.plan.family_weights import FAMILY_WEIGHTS, Weight, dense_weights, layer_dims
from jobs.recipe.plan.windows import layer_sliding_window
from models.registry import entry_for_model_type, get_entry

__all__ = [
    "FAMILY_WEIGHTS",
    "FlopsBreakdown",
    "LoraSpec",
    "Weight",
    "family_of",
    "flops_breakdown",
    "lora_params",
    "model_flops_per_token",
    "model_weights",
    "param_count",
]


def family_of(config: Any) -> str | None:
    """The registry family of a config (its first architecture, else its model_type)."""
    archs = cfg(config, "architectures") or []
    entry = get_entry(archs[0]) if isinstance(archs, list) and archs else None
    model_type = cfg(config, "model_type")
    if entry is None and isinstance(model_type, str):
        entry = entry_for_model_type(model_type)
    return entry.family if entry else None


def model_weights(config: Any, family: str | None = None) -> list[Weight]:
    """Every weight of the model `config` describes; `family` is the registry row's (read
    from the config when not given). Unregistered families are counted Llama-style.

    A plain-dict config's list is kept by its content: a submit asks for it three times
    (parameter count, FLOPs, memory estimate), and every job of one model the same."""
    config = readable(config)  # a config with per-layer sizes is read as its dict
    family = family or family_of(config)
    key = _content_key(config, family) if isinstance(config, dict) else None
    kept = _WEIGHTS.get(key) if key is not None else None
    if kept is not None:
        return list(kept)
    build: Callable[[Any], list[Weight]] = FAMILY_WEIGHTS.get(family or "", dense_weights)
    weights = _within_maxima(build(config))
    if key is not None:
        if len(_WEIGHTS) >= _WEIGHTS_KEPT:
            _WEIGHTS.clear()
        _WEIGHTS[key] = tuple(weights)
    return weights


def _within_maxima(weights: list[Weight]) -> list[Weight]:
    """The list, unless a size is negative or the model (or what one token multiplies
    through) is past `MAX_PARAM_COUNT`: ValueError, as for any config past its maxima."""
    if any(min(*w.shape, w.count, w.per_token) < 0 for w in weights):
        raise ValueError("config sizes must not be negative")
    params = sum(w.total for w in weights)
    active = sum(w.matmul_per_token for w in weights)
    if max(params, active) > MAX_PARAM_COUNT:
        raise ValueError(f"config has {max(params, active)} parameters; at most {MAX_PARAM_COUNT}")
    return weights


_WEIGHTS: dict[str, tuple[Weight, ...]] = {}
_WEIGHTS_KEPT = 256


def _content_key(config: dict[str, Any], family: str | None) -> str | None:
    try:
        return json.dumps([config, family], sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):  # not JSON-like (non-string keys, objects): not kept
        return None


def param_count(config: Any, family: str | None = None) -> int:
    """Parameters the model holds (tied embeddings counted once)."""
    return sum(w.total for w in model_weights(config, family))


def _targeted(weight: Weight, targets: list[str] | None, exclude: list[str] | None) -> bool:
    """Whether a LoRA adapter wraps this weight, as the trainer's peft setup selects modules
    (`jobs.recipe.model.lora_targets`, over the weight's name in layer 0): every linear layer
    but the lm_head for `match_all_linear` (no `targets`), else what the patterns select."""
    if weight.kind != "linear" or weight.name == "lm_head":
        return False
    name = f"model.layers.0.{weight.name}"
    if exclude and selects(lora_targets(exclude) or [], name):
        return False
    return not targets or selects(lora_targets(targets) or [], name)


def lora_params(
    weights: list[Weight],
    rank: int,
    targets: list[str] | None = None,
    exclude: list[str] | None = None,
) -> tuple[int, int]:
    """(adapter parameters in the model, adapter parameters one token passes through)."""
    total = active = 0
    for weight in weights:
        if _targeted(weight, targets, exclude):
            size = rank * (weight.shape[0] + weight.shape[1])
            total, active = total + size * weight.count, active + size * weight.per_token
    return total, active


# LoRA as the recipe's peft section gives it: rank, target_modules, exclude_modules.
LoraSpec = tuple[int, list[str] | None, list[str] | None]


@dataclass(frozen=True)
class FlopsBreakdown:
    """Training FLOPs per token: weight matmuls, attention scores, LoRA adapters."""

    matmul: float
    attention: float
    adapters: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.adapters


def _attention_flops(config: Any, seq_len: int) -> float:
    """Forward FLOPs per token of the score (q.k) and value (p.v) matmuls over `seq_len`
    keys (no causal halving, the convention published MFU figures use), layer by layer:
    each with its own heads and head size, and a sliding-window layer's tokens see at most
    its window of keys."""
    config = readable(config)
    overrides = layer_overrides(config)
    nope, rope = cfg(config, "qk_nope_head_dim"), cfg(config, "qk_rope_head_dim")
    total = 0
    for i, layer in enumerate(layer_dims(config)):
        keys = min(seq_len, layer_sliding_window(config, i, overrides) or seq_len)
        qk_dim = int(nope) + int(rope) if nope and rope else layer.head_dim
        v_dim = int(cfg(config, "v_head_dim") or layer.head_dim)
        total += 2 * layer.heads * (qk_dim + v_dim) * keys
    return float(total)


def flops_breakdown(
    config: Any,
    seq_len: int,
    family: str | None = None,
    lora: LoraSpec | int | None = None,
) -> FlopsBreakdown:
    """Training FLOPs per token. Full fine-tuning: 3 x forward (forward, input gradient,
    weight gradient) for every matmul a token passes through. LoRA (`lora` = rank, targets,
    excluded): the frozen base runs forward and input gradient only (2 x forward), the
    adapters all three; attention scores have no weights and cost 3 x forward either way.
    `lora` is (rank, target_modules, exclude_modules) as the recipe gives them, or the
    number of adapter parameters a token passes through (counted on a built model)."""
    config = readable(config)
    weights = model_weights(config, family)
    forward = sum(2 * w.matmul_per_token for w in weights)
    attention = 3 * _attention_flops(config, seq_len)
    if lora is None:
        return FlopsBreakdown(3.0 * forward, attention, 0.0)
    if isinstance(lora, int):
        active = lora
    else:
        rank, targets, exclude = lora
        _, active = lora_params(weights, rank, targets, exclude)
    return FlopsBreakdown(2.0 * forward, attention, 6.0 * active)


def model_flops_per_token(
    config: Any,
    seq_len: int,
    family: str | None = None,
    lora: LoraSpec | int | None = None,
) -> float:
    """Training FLOPs per token (see `flops_breakdown`); the embedding lookup gathers rows
    rather than multiplying and is left out, the lm_head is counted."""
    return flops_breakdown(config, seq_len, family, lora).total
