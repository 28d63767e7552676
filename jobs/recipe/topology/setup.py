"""The distributed topology of a job, and its rules, without torch.

`DistributedSetup.build(...)` takes a strategy (a name or a strategy config), the
parallelism sizes a user asked for (`ParallelismSizes`), optional pipeline and MoE configs,
the activation-checkpointing mode and the world size, checks every rule, and returns a
frozen setup with the resolved data-parallel size and the device-mesh shape the trainer
will build (axes pp, dp_replicate, dp_shard, cp, tp for FSDP2). Every broken rule is a
`FieldError` at its `distributed.*` field; `build` raises `DistributedSetupInvalid` with
all of them. `jobs.recipe.topology.section` reads the recipe's `distributed:` section.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from jobs.recipe.errors import FieldError, RecipeInvalid, did_you_mean, shown
from jobs.recipe.load import limits
from jobs.recipe.load.plain import field_names
from jobs.recipe.load.schema_errors import field_errors
from jobs.recipe.topology.rules import ParallelismSizes, check_topology

LOC = "distributed"
STRATEGY_NAMES = {
    "fsdp2": "fsdp2",
    "megatron_fsdp": "megatron_fsdp",
    "megatron-fsdp": "megatron_fsdp",
    "mfsdp": "megatron_fsdp",
    "ddp": "ddp",
}
AC_SCOPES = ("all", "language", "vision", "audio", "multimodal")
Dtype = Literal["float32", "bfloat16", "float16"]
_STRICT = ConfigDict(extra="forbid", defer_build=True)
# Counts of layers (prefetch depths, layers per pipeline stage) and of samples (a pipeline
# micro-batch), within what a model has and a rank's micro-batch holds.
LayerCount = Annotated[int, Field(gt=0, le=limits.MAX_MODEL_SIZES["num_hidden_layers"])]
MicroBatch = Annotated[int, Field(gt=0, le=limits.MAX_LOCAL_BATCH)]


class DistributedSetupInvalid(RecipeInvalid, ValueError):
    """A DistributedSetup that breaks one or more rules (a ValueError, so callers that catch ValueError see it too)."""


def normalize_ac_scope(value: Any) -> tuple[str, ...]:
    """'all' | 'language' | ... or a list of them; 'all' only alone. ValueError otherwise."""
    parts = [value] if isinstance(value, str) else value
    if value is None:
        return ("all",)
    if not isinstance(parts, list | tuple) or not all(isinstance(p, str) for p in parts):
        raise ValueError(
            "must be a scope name or a list of scope names | fix: "
            "set activation_checkpointing_scope: all"
        )
    scopes = []
    for part in (p.strip().lower() for p in parts):
        if part not in AC_SCOPES:
            raise ValueError(
                f"unknown scope {shown(part)} | fix: use one of {', '.join(AC_SCOPES)}"
            )
        if part not in scopes:
            scopes.append(part)
    if "all" in scopes and len(scopes) > 1:
        raise ValueError(
            "'all' cannot be combined with other scopes | fix: use 'all' alone "
            "or list only the specific scopes"
        )
    return tuple(scopes) or ("all",)


@pydantic_dataclass(frozen=True, config=_STRICT)
class MixedPrecision:
    # None as torch's MixedPrecisionPolicy: compute in (or return) the parameters' own dtype
    param_dtype: Dtype | None = "bfloat16"
    reduce_dtype: Dtype = "float32"
    output_dtype: Dtype | None = "bfloat16"
    cast_forward_inputs: bool = True


@pydantic_dataclass(frozen=True, config=_STRICT)
class FSDP2Config:
    sequence_parallel: bool = False
    mp_policy: MixedPrecision | None = None
    cpu_offload: bool = False
    autocast_dtype: Dtype | None = None
    activation_checkpointing_scope: tuple[str, ...] = ("all",)
    defer_fsdp_grad_sync: bool = True
    reshard_after_forward: bool | None = None
    enable_async_tensor_parallel: bool = False
    enable_compile: bool = False
    enable_fsdp2_prefetch: bool = False
    fsdp2_backward_prefetch_depth: LayerCount = 2
    fsdp2_forward_prefetch_depth: LayerCount = 1
    patch_is_packed_sequence: bool = False

    @field_validator("activation_checkpointing_scope", mode="before")
    @classmethod
    def _normalize_scope(cls, value: Any) -> tuple[str, ...]:
        return normalize_ac_scope(value)


@pydantic_dataclass(frozen=True, config=_STRICT)
class MegatronFSDPConfig:
    """AutoModel's Megatron-FSDP options; the job runs them as FSDP2
    (`jobs.recipe.topology.megatron_fsdp`)."""

    sequence_parallel: bool = False
    zero_dp_strategy: Literal[0, 1, 2, 3] = 3
    init_fsdp_with_meta_device: bool = False
    grad_reduce_in_fp32: bool = False
    preserve_fp32_weights: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    average_in_collective: bool = False
    disable_bucketing: bool = False
    calculate_per_token_loss: bool = False
    megatron_fsdp_unit_modules: tuple[str, ...] | None = None
    check_for_nan_in_grad: bool = True
    report_nan_in_param_grad: bool = False
    keep_fp8_transpose_cache: bool = False
    nccl_ub: bool = False
    fsdp_double_buffer: bool = False


@pydantic_dataclass(frozen=True, config=_STRICT)
class DDPConfig:
    activation_checkpointing_scope: tuple[str, ...] = ("all",)
    broadcast_buffers: bool = False
    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: Annotated[float, Field(le=limits.MAX_BUCKET_CAP_MB)] | None = None
    gradient_as_bucket_view: bool = False
    autocast_dtype: Dtype | None = None

    @field_validator("activation_checkpointing_scope", mode="before")
    @classmethod
    def _normalize_scope(cls, value: Any) -> tuple[str, ...]:
        return normalize_ac_scope(value)


@pydantic_dataclass(frozen=True, config=_STRICT)
class PipelineConfig:
    # torch.distributed.pipelining's schedule names, lower-cased as torch matches them; the
    # recipe's spelling (`Interleaved1F1B`, `looped_bfs`) is folded onto these first.
    pp_schedule: Literal[
        "1f1b",
        "gpipe",
        "interleaved1f1b",
        "loopedbfs",
        "interleavedzerobubble",
        "zbvzerobubble",
        "dualpipev",
    ] = "1f1b"
    pp_microbatch_size: MicroBatch = 1
    layers_per_stage: LayerCount | None = None
    scale_grads_in_schedule: bool = False
    # AutoModel's stage-splitting and patching switches (read with pp_size > 1 only)
    round_virtual_stages_to_pp_multiple: Literal["up", "down"] | None = None
    patch_inner_model: bool = True
    patch_causal_lm_model: bool = True
    dtype: str | None = None


@pydantic_dataclass(frozen=True, config=_STRICT)
class MoEParallelConfig:
    ignore_router_for_ac: bool = True
    reshard_after_forward: bool = False
    wrap_outer_model: bool = True
    lm_head_precision: Dtype | None = None


StrategyConfig = FSDP2Config | MegatronFSDPConfig | DDPConfig
STRATEGY_CONFIGS: dict[str, type] = {
    "fsdp2": FSDP2Config,
    "megatron_fsdp": MegatronFSDPConfig,
    "ddp": DDPConfig,
}


def strategy_name(config: StrategyConfig) -> str:
    return next(name for name, cls in STRATEGY_CONFIGS.items() if isinstance(config, cls))


@cache
def _adapter(cls: type) -> TypeAdapter:
    """One TypeAdapter per config class: building one costs milliseconds per call."""
    return TypeAdapter(cls)


def resolve_strategy(
    strategy: str | StrategyConfig,
    options: Mapping[str, Any] | None = None,
    also_known: tuple[str, ...] = (),
) -> tuple[StrategyConfig | None, list[FieldError]]:
    """A strategy config from a name plus options, or a config object as is."""
    if isinstance(strategy, FSDP2Config | MegatronFSDPConfig | DDPConfig):
        return strategy, []
    name = STRATEGY_NAMES.get(str(strategy).lower()) if isinstance(strategy, str) else None
    if name is None:
        hint = did_you_mean(str(strategy), STRATEGY_NAMES)
        return None, [
            FieldError(
                f"{LOC}.strategy",
                f"unknown strategy {shown(strategy)}",
                "use fsdp2, megatron_fsdp or ddp" + (f" ({hint})" if hint else ""),
            )
        ]
    cls = STRATEGY_CONFIGS[name]
    try:
        return _adapter(cls).validate_python(dict(options or {})), []
    except ValidationError as exc:
        errors = field_errors(exc, LOC, [*(f.name for f in fields(cls)), *also_known])
        return None, [_strategy_option_error(e, name) for e in errors]


def _strategy_option_error(err: FieldError, name: str) -> FieldError:
    if err.msg.startswith("unknown key"):
        return FieldError(
            err.loc,
            f"{err.msg.removeprefix('unknown key ')} is not an option of strategy {name}",
            err.fix,
        )
    return err


def _sub_config(cls: type, value: Any, loc: str) -> tuple[Any, list[FieldError]]:
    if value is None or isinstance(value, cls):
        return value, []
    try:
        return _adapter(cls).validate_python(value), []
    except ValidationError as exc:
        return None, field_errors(exc, loc, [f.name for f in fields(cls)])


@dataclass(frozen=True)
class DistributedSetup:
    """Resolved topology and policies; `sizes.dp_size` is always an int here."""

    strategy_config: StrategyConfig
    sizes: ParallelismSizes
    world_size: int
    pipeline_config: PipelineConfig | None = None
    moe_parallel_config: MoEParallelConfig | None = None
    activation_checkpointing: bool | str = False

    @property
    def strategy(self) -> str:
        return strategy_name(self.strategy_config)

    @property
    def dp_size(self) -> int:
        return int(self.sizes.dp_size or 1)

    @property
    def dp_shard_size(self) -> int:
        return self.dp_size // self.sizes.dp_replicate_size

    @property
    def mesh_shape(self) -> dict[str, int]:
        """Axis name -> size, in the order the trainer builds the device mesh."""
        s = self.sizes
        if self.strategy == "fsdp2":
            return {
                "pp": s.pp_size,
                "dp_replicate": s.dp_replicate_size,
                "dp_shard": self.dp_shard_size,
                "cp": s.cp_size,
                "tp": s.tp_size,
            }
        if self.strategy == "megatron_fsdp":
            return {"dp": self.dp_size, "cp": s.cp_size, "tp": s.tp_size}
        return {"dp": self.dp_size}

    @classmethod
    def build(
        cls,
        strategy: str | StrategyConfig = "fsdp2",
        parallelism_sizes: ParallelismSizes | None = None,
        pipeline_config: PipelineConfig | Mapping[str, Any] | None = None,
        moe_parallel_config: MoEParallelConfig | Mapping[str, Any] | None = None,
        activation_checkpointing: bool | str = False,
        world_size: int | None = None,
    ) -> DistributedSetup:
        """Check every rule and resolve dp; raises DistributedSetupInvalid with all errors."""
        world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
        config, errors = resolve_strategy(strategy)
        sizes = parallelism_sizes or ParallelismSizes()
        pipeline, errs = _sub_config(PipelineConfig, pipeline_config, f"{LOC}.pipeline")
        moe, moe_errs = _sub_config(MoEParallelConfig, moe_parallel_config, f"{LOC}.moe")
        errors += errs + moe_errs
        dp = None
        if config is not None:
            dp, errs = check_topology(
                strategy_name(config),
                sizes,
                world,
                pipeline_given=pipeline_config is not None,
                moe_given=moe_parallel_config is not None,
                activation_checkpointing=activation_checkpointing,
                sequence_parallel=bool(getattr(config, "sequence_parallel", False)),
            )
            errors += errs
        if errors or config is None or dp is None:
            raise DistributedSetupInvalid(errors)
        if sizes.pp_size > 1 and pipeline is None:
            pipeline = PipelineConfig()
        if sizes.ep_size > 1 and moe is None:
            moe = MoEParallelConfig()
        resolved = replace(sizes, dp_size=dp)
        ac = "full" if activation_checkpointing is True else activation_checkpointing
        return cls(config, resolved, world, pipeline, moe, ac)

    def to_dict(self) -> dict[str, Any]:
        """The canonical `distributed` section of a normalized recipe."""
        s = self.sizes
        options = _plain(self.strategy_config)
        if "activation_checkpointing_scope" in options:
            options["activation_checkpointing_scope"] = list(
                options["activation_checkpointing_scope"]
            )
        return {
            "strategy": self.strategy,
            "dp_size": self.dp_size,
            "dp_replicate_size": s.dp_replicate_size,
            "tp_size": s.tp_size,
            "pp_size": s.pp_size,
            "cp_size": s.cp_size,
            "ep_size": s.ep_size,
            "sequence_parallel": bool(options.pop("sequence_parallel", False)),
            "activation_checkpointing": self.activation_checkpointing,
            "pipeline": _plain(self.pipeline_config) if self.pipeline_config else None,
            "moe": _plain(self.moe_parallel_config) if self.moe_parallel_config else None,
            **options,
        }


def _plain(obj: Any) -> dict[str, Any]:
    """`dataclasses.asdict` for these frozen configs, whose values are immutable (scalars,
    tuples, nested configs): no deep copies, field names looked up once per class."""
    out = {}
    for name in field_names(type(obj)) or ():
        value = getattr(obj, name)
        out[name] = value if field_names(type(value)) is None else _plain(value)
    return out
