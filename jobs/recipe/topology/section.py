"""The recipe's `distributed:` section, read into a `DistributedSetup`.

The section holds the setup-level keys (strategy, the six sizes, activation checkpointing,
`pipeline`, `moe`) next to the chosen strategy's own options, flat, as AutoModel recipes
write them. `setup_from_section` separates the two, accepts AutoModel's aliases
(`pipeline_config`, `moe_parallel_config`, a strategy manager `_target_`, `dp_size: none`)
and returns the setup or every error at its `distributed.*` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.topology.rules import SIZE_FIELDS, ParallelismSizes, check_topology
from jobs.recipe.topology.setup import (
    LOC,
    STRATEGY_NAMES,
    DistributedSetup,
    DistributedSetupInvalid,
    resolve_strategy,
)

_SECTION_KEYS = (*SIZE_FIELDS, "strategy", "activation_checkpointing", "pipeline", "moe")
_SECTION_ALIASES = {"pipeline_config": "pipeline", "moe_parallel_config": "moe"}


def _size_value(name: str, value: Any) -> Any:
    if name == "dp_size" and (value is None or str(value).lower() in {"auto", "none", "null"}):
        return None
    return value


_MANAGER_TARGETS = {
    "nemo_automodel.components.distributed.fsdp2.FSDP2Manager": "fsdp2",
    "nemo_automodel.components.distributed.megatron_fsdp.MegatronFSDPManager": "megatron_fsdp",
    "nemo_automodel.components.distributed.ddp.DDPManager": "ddp",
}


def _split_section(section: dict[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """Pop the setup-level keys out of `section` (leaving strategy options); fold aliases.

    An AutoModel manager `_target_` names the strategy.
    """
    errors: list[FieldError] = []
    for alias, name in _SECTION_ALIASES.items():
        if alias in section:
            section.setdefault(name, section.pop(alias))
    common = {k: section.pop(k) for k in list(section) if k in _SECTION_KEYS}
    if "_target_" in section:
        target = section.pop("_target_")
        if isinstance(target, str) and target in _MANAGER_TARGETS:
            common.setdefault("strategy", _MANAGER_TARGETS[target])
        else:
            errors.append(
                FieldError(
                    f"{LOC}._target_",
                    f"{shown(target)} is not a strategy manager",
                    f"remove it and set {LOC}.strategy: fsdp2, megatron_fsdp or ddp",
                )
            )
    name = STRATEGY_NAMES.get(str(common.get("strategy", "fsdp2")).lower())
    if name == "ddp" and section.get("sequence_parallel") in (False, None):
        section.pop("sequence_parallel", None)  # the normalized recipe writes it for every strategy
    return common, errors


def setup_from_section(
    section: Mapping[str, Any] | None,
    world_size: int,
) -> tuple[DistributedSetup | None, list[FieldError]]:
    """Build the DistributedSetup a recipe's `distributed:` section describes."""
    if section is not None and not isinstance(section, Mapping):
        return None, [FieldError(LOC, "must be a mapping", "give distributed: {strategy: fsdp2}")]
    options = dict(section or {})
    common, errors = _split_section(options)
    config, strategy_errors = resolve_strategy(
        common.get("strategy", "fsdp2"), options, _SECTION_KEYS
    )
    errors += strategy_errors
    if config is None:
        return None, errors + _other_errors(common, world_size)
    sizes = ParallelismSizes(**{k: _size_value(k, common[k]) for k in SIZE_FIELDS if k in common})
    try:
        setup = DistributedSetup.build(
            config,
            sizes,
            pipeline_config=common.get("pipeline"),
            moe_parallel_config=common.get("moe"),
            activation_checkpointing=common.get("activation_checkpointing", False),
            world_size=world_size,
        )
    except DistributedSetupInvalid as exc:
        return None, errors + exc.errors
    return (setup, []) if not errors else (None, errors)


def _other_errors(common: Mapping[str, Any], world_size: int) -> list[FieldError]:
    """With the strategy config invalid, still report the topology errors."""
    name = STRATEGY_NAMES.get(str(common.get("strategy", "fsdp2")).lower(), "fsdp2")
    sizes = ParallelismSizes(**{k: _size_value(k, common[k]) for k in SIZE_FIELDS if k in common})
    return check_topology(
        name,
        sizes,
        world_size,
        activation_checkpointing=common.get("activation_checkpointing", False),
        pipeline_given=common.get("pipeline") is not None,
        moe_given=common.get("moe") is not None,
    )[1]
