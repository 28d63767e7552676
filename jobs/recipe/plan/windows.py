"""Which layers attend through a sliding window, from a config alone (torch-free).

A transformers config object carries `layer_types`; the config.json validation reads may not
(transformers derives it when the config is built), so the families' own rules stand in:
Gemma 2 and gpt-oss alternate from a windowed first layer, Gemma 3 windows all but every
`sliding_window_pattern`-th layer, Qwen2/Qwen3 window the layers from `max_window_layers` on
when `use_sliding_window` is set, and any other config with a `sliding_window` (Mistral,
Mixtral) windows every layer. The native layers and the FLOPs count read the same answer.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.plan.family_weights import cfg

_ALTERNATING = frozenset({"gemma2", "gpt_oss"})
_PATTERNED = frozenset({"gemma3", "gemma3_text"})


def _derived_layer_type(config: Any, layer_idx: int) -> str:
    model_type = str(cfg(config, "model_type") or "")
    if model_type in _ALTERNATING:
        return "sliding_attention" if layer_idx % 2 == 0 else "full_attention"
    if model_type in _PATTERNED:
        pattern = int(
            cfg(config, "sliding_window_pattern") or cfg(config, "_sliding_window_pattern") or 6
        )
        return "full_attention" if (layer_idx + 1) % pattern == 0 else "sliding_attention"
    if cfg(config, "use_sliding_window") is not None:  # Qwen2 / Qwen3 configs
        first = int(cfg(config, "max_window_layers") or 0)
        windowed = bool(cfg(config, "use_sliding_window")) and layer_idx >= first
        return "sliding_attention" if windowed else "full_attention"
    return "sliding_attention"


def layer_sliding_window(config: Any, layer_idx: int) -> int | None:
    """Layer `layer_idx`'s attention window in tokens, or None for full causal attention."""
    window = cfg(config, "sliding_window")
    if not window or cfg(config, "use_sliding_window") is False:
        return None
    layer_types = cfg(config, "layer_types")
    kind = layer_types[layer_idx] if layer_types else _derived_layer_type(config, layer_idx)
    return int(window) if kind == "sliding_attention" else None
