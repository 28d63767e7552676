"""A model config's fields as the counts read them: whole-model values and per-layer overrides.

`cfg` reads one field from a transformers config or the plain dict of a config.json (under
the other names some architectures give it). Some configs size layers differently: a
transformers 5 heterogeneous config keeps each field's global value plus `per_layer_config`,
the fields of the layers that differ (Gemma-4: `head_dim` for its sliding-window layers,
the wider global head on its full-attention layers). Reading such a field off the config
object raises (`AmbiguousGlobalPerLayerAttributeError`), so `readable` turns that object
into its dict (the global values and `per_layer_config`, as its config.json holds them) and
`layer_overrides` gives each differing layer's fields by layer index.
"""

from __future__ import annotations

from typing import Any

# Other spellings of the same sizes in config.json files of non-Llama architectures.
ALIASES = {
    "hidden_size": ("n_embd", "d_model"),
    "num_hidden_layers": ("n_layer", "num_layers"),
    "num_attention_heads": ("n_head",),
    "intermediate_size": ("n_inner",),
}


def cfg(config: Any, name: str, default: Any = None) -> Any:
    """A config field from a transformers config or a plain dict (or one of its `ALIASES`);
    None counts as absent."""
    for key in (name, *ALIASES.get(name, ())):
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if value is not None:
            return value
    return default


def readable(config: Any) -> Any:
    """`config`, or its dict when transformers keeps some of its fields per layer."""
    if not isinstance(config, dict) and getattr(config, "is_heterogeneous", False) is True:
        return config.to_dict()
    return config


def layer_overrides(config: Any) -> dict[int, dict[str, Any]]:
    """Layer index -> the fields that layer sets itself (`per_layer_config`, whose keys a
    config.json writes as zero-padded strings); {} for a config whose layers are alike."""
    raw = config.get("per_layer_config") if isinstance(config, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {
        int(key): fields
        for key, fields in raw.items()
        if str(key).isdigit() and isinstance(fields, dict)
    }
