"""Which layers attend through a sliding window, from a config alone (torch-free).

A transformers config object carries `layer_types`; the config.json validation reads may not
(transformers derives it when the config is built), so the families' own rules stand in:
Gemma 2 and gpt-oss alternate from a windowed first layer, Gemma 3 windows all but every
`sliding_window_pattern`-th layer, Gemma 3n all but every 5th and Gemma 4 all but every 6th
and its last, Qwen2/Qwen3 window the layers from `max_window_layers` on when
`use_sliding_window` is set, and any other config with a `sliding_window` (Mistral, Mixtral)
windows every layer. A layer's own `sliding_window` in `per_layer_config` overrides the
config's. The native layers and the FLOPs count read the same answer.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.plan.config_fields import cfg, layer_overrides

_ALTERNATING = frozenset({"gemma2", "gpt_oss"})
_PATTERNED = frozenset({"gemma3", "gemma3_text"})
# Full attention every n-th layer, whatever the config says about a pattern.
_FIXED_PATTERN = {"gemma3n": 5, "gemma3n_text": 5, "gemma4": 6, "gemma4_text": 6}
_LAST_LAYER_FULL = frozenset({"gemma4", "gemma4_text"})  # transformers forces it


def _derived_layer_type(config: Any, layer_idx: int) -> str:
    model_type = str(cfg(config, "model_type") or "")
    if model_type in _ALTERNATING:
        return "sliding_attention" if layer_idx % 2 == 0 else "full_attention"
    if model_type in _PATTERNED or model_type in _FIXED_PATTERN:
        pattern = _FIXED_PATTERN.get(model_type) or int(
            cfg(config, "sliding_window_pattern") or cfg(config, "_sliding_window_pattern") or 6
        )
        return "full_attention" if (layer_idx + 1) % pattern == 0 else "sliding_attention"
    if cfg(config, "use_sliding_window") is not None:  # Qwen2 / Qwen3 configs
        first = int(cfg(config, "max_window_layers") or 0)
        windowed = bool(cfg(config, "use_sliding_window")) and layer_idx >= first
        return "sliding_attention" if windowed else "full_attention"
    return "sliding_attention"


def layer_type(config: Any, layer_idx: int) -> str:
    """`layer_types[layer_idx]`, or what transformers would derive for it."""
    model_type = str(cfg(config, "model_type") or "")
    last = int(cfg(config, "num_hidden_layers", 0) or 0) - 1
    if model_type in _LAST_LAYER_FULL and layer_idx == last:
        return "full_attention"
    layer_types = cfg(config, "layer_types")
    return layer_types[layer_idx] if layer_types else _derived_layer_type(config, layer_idx)


def layer_sliding_window(
    config: Any, layer_idx: int, overrides: dict[int, dict[str, Any]] | None = None
) -> int | None:
    """Layer `layer_idx`'s attention window in tokens, or None for full causal attention.
    `overrides` are the config's `layer_overrides`, when the caller asks for many layers."""
    own = (layer_overrides(config) if overrides is None else overrides).get(layer_idx, {})
    window = own["sliding_window"] if "sliding_window" in own else cfg(config, "sliding_window")
    if not window or cfg(config, "use_sliding_window") is False:
        return None
    return int(window) if layer_type(config, layer_idx) == "sliding_attention" else None
