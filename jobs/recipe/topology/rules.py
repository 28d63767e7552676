"""The rules a parallel topology must satisfy, one small function each.

`check_topology` runs them all for a strategy name, the requested `ParallelismSizes` and
the world size, and returns the resolved data-parallel size and every broken rule as a
`FieldError` at its `distributed.*` field, with the YAML that fixes it. Every size and the
world size stay within `MAX_PARALLEL_SIZE` and `MAX_WORLD_SIZE` (`jobs.recipe.load.limits`).
`jobs.recipe.topology.setup.DistributedSetup.build` calls it; so does recipe validation.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.load.limits import MAX_PARALLEL_SIZE, MAX_WORLD_SIZE, at_most

LOC = "distributed"
SIZE_FIELDS = ("dp_size", "dp_replicate_size", "tp_size", "pp_size", "cp_size", "ep_size")
AC_MODES = (False, True, "full", "selective")


@dataclass(frozen=True)
class ParallelismSizes:
    """The sizes a user asked for; dp_size None is inferred from the world size."""

    dp_size: int | None = None
    dp_replicate_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1
    ep_size: int = 1


def _err(field: str, msg: str, fix: str) -> FieldError:
    return FieldError(f"{LOC}.{field}", msg, fix)


def size_errors(sizes: ParallelismSizes) -> list[FieldError]:
    errors = []
    for name in SIZE_FIELDS:
        value = getattr(sizes, name)
        if name == "dp_size" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            extra = " or auto" if name == "dp_size" else ""
            errors.append(
                _err(
                    name,
                    f"must be a positive integer{extra}, got {shown(value)}",
                    f"set {LOC}.{name}: {'auto' if extra else 1}",
                )
            )
        elif value > MAX_PARALLEL_SIZE:
            errors.append(
                _err(
                    name,
                    f"is {value}; at most {at_most(MAX_PARALLEL_SIZE)} ranks are accepted",
                    f"set {LOC}.{name} to at most {MAX_PARALLEL_SIZE}",
                )
            )
    return errors


def world_errors(world: int) -> list[FieldError]:
    """The world size (nnodes x nproc_per_node) within `MAX_WORLD_SIZE` ranks."""
    if world <= MAX_WORLD_SIZE:
        return []
    return [
        FieldError(
            "resources.nnodes",
            f"nnodes x nproc_per_node = {world} ranks; at most {at_most(MAX_WORLD_SIZE)}",
            f"use at most {MAX_WORLD_SIZE} ranks in all",
        )
    ]


def resolve_dp(sizes: ParallelismSizes, world: int) -> tuple[int | None, list[FieldError]]:
    """dp = world / (tp*cp*pp) when inferred; an explicit dp must make the product exact."""
    model = sizes.tp_size * sizes.cp_size * sizes.pp_size
    if sizes.dp_size is None:
        if world % model:
            field = next(f for f in ("tp_size", "cp_size", "pp_size") if getattr(sizes, f) > 1)
            return None, [
                _err(
                    field,
                    f"tp*cp*pp = {model} does not divide the world size "
                    f"{world} (nnodes x nproc_per_node)",
                    f"choose sizes whose product divides {world}",
                )
            ]
        return world // model, []
    if sizes.dp_size * model != world:
        return None, [
            _err(
                "dp_size",
                f"dp*tp*cp*pp = {sizes.dp_size * model} but the world "
                f"size is {world} (nnodes x nproc_per_node)",
                f"set {LOC}.dp_size: auto (= {world // model})"
                if world % model == 0
                else f"choose sizes whose product is {world}",
            )
        ]
    return sizes.dp_size, []


def _unsupported_size_errors(strategy: str, sizes: ParallelismSizes) -> list[FieldError]:
    """ddp: data parallel only; megatron_fsdp: no pp, no ep."""
    unsupported = {
        "ddp": ("tp_size", "pp_size", "cp_size", "ep_size"),
        "megatron_fsdp": ("pp_size", "ep_size"),
    }.get(strategy, ())
    return [
        _err(
            name,
            f"strategy {strategy} does not support {name} > 1",
            f"set {LOC}.{name}: 1 or use {LOC}.strategy: fsdp2",
        )
        for name in unsupported
        if getattr(sizes, name) > 1
    ]


def _replicate_errors(strategy: str, replicate: int, dp: int | None) -> list[FieldError]:
    """dp_replicate > 1: fsdp2 only (HSDP), dividing dp and smaller than it."""
    if replicate <= 1:
        return []
    if strategy != "fsdp2":
        return [
            _err(
                "dp_replicate_size",
                f"dp_replicate_size > 1 needs fsdp2, not {strategy}",
                f"set {LOC}.dp_replicate_size: 1",
            )
        ]
    if dp is not None and (dp % replicate or replicate >= dp):
        return [
            _err(
                "dp_replicate_size",
                f"must divide dp_size {dp} and be smaller than it",
                f"choose a divisor of {dp} below {dp}, or 1",
            )
        ]
    return []


def strategy_errors(strategy: str, sizes: ParallelismSizes, dp: int | None) -> list[FieldError]:
    errors = _unsupported_size_errors(strategy, sizes)
    errors += _replicate_errors(strategy, sizes.dp_replicate_size, dp)
    if strategy == "fsdp2" and dp is not None and sizes.ep_size > 1:
        span = dp * sizes.cp_size * sizes.tp_size
        if span % sizes.ep_size:
            errors.append(
                _err(
                    "ep_size",
                    f"dp*cp*tp = {span} is not divisible by ep_size {sizes.ep_size}",
                    f"choose an ep_size that divides {span}",
                )
            )
    return errors


def companion_errors(
    sizes: ParallelismSizes, *, pipeline_given: bool, moe_given: bool, sequence_parallel: bool
) -> list[FieldError]:
    errors = []
    if pipeline_given and sizes.pp_size <= 1:
        errors.append(
            _err(
                "pipeline",
                "a pipeline config needs pp_size > 1",
                f"remove {LOC}.pipeline or set {LOC}.pp_size > 1",
            )
        )
    if moe_given and sizes.ep_size <= 1:
        errors.append(
            _err(
                "moe",
                "a MoE parallel config needs ep_size > 1",
                f"remove {LOC}.moe or set {LOC}.ep_size > 1",
            )
        )
    if sequence_parallel and sizes.tp_size <= 1:
        errors.append(
            _err(
                "sequence_parallel",
                "sequence parallelism needs tp_size > 1",
                f"set {LOC}.sequence_parallel: false or {LOC}.tp_size > 1",
            )
        )
    return errors


def activation_checkpointing_errors(strategy: str, mode: object) -> list[FieldError]:
    if not any(mode is m or (isinstance(m, str) and mode == m) for m in AC_MODES):
        return [
            _err(
                "activation_checkpointing",
                f"must be false, true, 'full' or 'selective', got {shown(mode)}",
                f"set {LOC}.activation_checkpointing: true",
            )
        ]
    if mode == "selective" and strategy not in ("fsdp2", "ddp"):
        return [
            _err(
                "activation_checkpointing",
                f"'selective' is not available with {strategy}",
                f"set {LOC}.activation_checkpointing: full or use fsdp2 / ddp",
            )
        ]
    return []


def check_topology(
    strategy: str,
    sizes: ParallelismSizes,
    world: int,
    *,
    pipeline_given: bool = False,
    moe_given: bool = False,
    activation_checkpointing: object = False,
    sequence_parallel: bool = False,
) -> tuple[int | None, list[FieldError]]:
    """Every topology rule at once; returns (resolved dp or None, errors)."""
    errors = size_errors(sizes) + world_errors(world)
    errors += activation_checkpointing_errors(strategy, activation_checkpointing)
    errors += companion_errors(
        sizes,
        pipeline_given=pipeline_given,
        moe_given=moe_given,
        sequence_parallel=sequence_parallel,
    )
    if any(e.loc.endswith("_size") or e.loc.startswith("resources") for e in errors):
        return None, errors
    dp, dp_errors = resolve_dp(sizes, world)
    return dp, errors + dp_errors + strategy_errors(strategy, sizes, dp)
