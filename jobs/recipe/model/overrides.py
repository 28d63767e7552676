"""Config attribute overrides given as model keywords: `model: {..., num_hidden_layers: 2}`.

A model loader (and `transformers.AutoConfig.from_pretrained` under `model.config`) takes,
besides its own keywords, overrides of the model config's attributes, as Hugging Face's
loaders do. Where the config is readable at submit, each override must name an attribute
the config has (a did-you-mean otherwise) with a value of the same JSON type; on a
`from_pretrained` load an override that changes a weight's shape (layers, widths, heads,
vocabulary, experts) is refused, since the checkpoint's tensors would not fit. Where the
config is not readable (an uncached hub model) the overrides are accepted with a warning.
Either way an override is never a transformers loader option (`device_map`, `cache_dir`,
...): `jobs.recipe.targets.loader_kwargs` refuses those at the `_target_` check, and they are
not overrides here.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError, did_you_mean
from jobs.recipe.load.limits import MAX_MODEL_SIZES
from jobs.recipe.targets.loader_kwargs import is_override_name
from jobs.recipe.targets.table import TARGETS

# Config attributes that set a weight's shape (or how many weights there are).
SHAPE_KEYS = frozenset(
    {
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "num_experts",
        "num_local_experts",
        "n_routed_experts",
        "n_shared_experts",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "first_k_dense_replace",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
    }
)
# PretrainedConfig attributes every config has even when config.json leaves them out.
COMMON_ATTRIBUTES = frozenset(
    {
        "use_cache",
        "output_router_logits",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torch_dtype",
        "dtype",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "name_or_path",  # where the config was read from (metadata, set on every load)
    }
)
FROM_PRETRAINED = "pretrained_model_name_or_path"


def overrides_of(section: dict[str, Any]) -> dict[str, Any]:
    """The keywords of a target section that are config attribute overrides (a loader
    option or a name no attribute can have is refused elsewhere, not an override)."""
    target = section.get("_target_")
    spec = TARGETS.get(target) if isinstance(target, str) else None
    if spec is None or not spec.overrides:
        return {}
    known = set(spec.params or ()) | set(spec.injected) | {"_target_", FROM_PRETRAINED}
    return {
        k: v
        for k, v in section.items()
        if k not in known and k not in spec.nested and is_override_name(k)
    }


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a mapping" if isinstance(value, dict) else "null"


def _one(key: str, value: Any, loc: str, config: dict[str, Any], pretrained: bool):
    if key not in config and key not in COMMON_ATTRIBUTES:
        hint = did_you_mean(key, config)
        fix = hint or f"remove {loc}; it is not an attribute of the model's config"
        arch = (config.get("architectures") or [config.get("model_type", "the model")])[0]
        return FieldError(loc, f"{arch}'s config has no attribute {key!r}", fix)
    current = config.get(key)
    if current is not None and value is not None and _json_kind(value) != _json_kind(current):
        msg = f"must be {_json_kind(current)} like the config's {current!r}"
        return FieldError(loc, msg, f"set {loc} to {_json_kind(current)}")
    if pretrained and key in SHAPE_KEYS and value != current:
        msg = (
            f"changes a weight shape of the checkpoint ({key} is {current!r} there, "
            f"{value!r} here): its tensors would not load"
        )
        fix = "remove it, or build a new model with from_config and this override"
        return FieldError(loc, msg, fix)
    return None


def _size_error(key: str, value: Any, loc: str) -> FieldError | None:
    """A size the plan reads (`MAX_MODEL_SIZES`) must be a whole number up to its maximum,
    whether or not the config is readable."""
    limit = MAX_MODEL_SIZES.get(key)
    if limit is None or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        return FieldError(
            loc, f"{key} must be a whole number from 1 to {limit}", f"set {loc} to at most {limit}"
        )
    return None


def check_overrides(
    section: dict[str, Any], loc: str, config: dict[str, Any] | None, pretrained: bool
) -> tuple[list[FieldError], list[FieldError]]:
    """(errors, warnings) for the overrides in `section` against `config` (None: unreadable)."""
    overrides = overrides_of(section)
    sizes = [_size_error(k, v, f"{loc}.{k}") for k, v in overrides.items()]
    errors = [e for e in sizes if e is not None]
    if errors:
        return errors, []
    if config is None:
        why = "accepted unchecked: a config override, and the model's config is not readable here"
        return [], [FieldError(f"{loc}.{key}", why) for key in overrides]
    found = [_one(k, v, f"{loc}.{k}", config, pretrained) for k, v in overrides.items()]
    return [e for e in found if e is not None], []


def config_with_overrides(
    config: dict[str, Any] | None, section: dict[str, Any]
) -> dict[str, Any] | None:
    """The config as the trainer will build it (for the plan's parameter count)."""
    if config is None:
        return None
    nested = section.get("config")
    inner = overrides_of(nested) if isinstance(nested, dict) else {}
    return {**config, **inner, **overrides_of(section)}
