"""The typed, frozen recipe the trainer runs: every default filled, every number derived once.

`validate_job` ends by building a `Recipe` from the normalized sections, the resolved
DistributedSetup and the job's resources. `Recipe.to_json()` is what the database stores
and the worker hands to the trainer; `Recipe.from_json()` rebuilds the same object without
validating or defaulting anything: every key must be present (except a field added later
with a default, which is what recipes stored before it meant), so a stored recipe that is
not one of these is refused at once rather than half-read. Builders take the sub-object
they need (`recipe.optimizer`, `recipe.topology`, `recipe.step_scheduler`), never the
whole recipe.

A `_target_` section is a `TargetCall`; it serialises back to the `{_target_: ..., kw: v}`
mapping a recipe writes, so the stored JSON reads like the recipe that was submitted.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from jobs.recipe.load.plain import LEAVES, field_names
from jobs.recipe.sections.embedding_row_repair import EmbeddingRowRepair
from jobs.recipe.sections.neftune import Neftune
from jobs.recipe.sections.quantization import Quantization
from jobs.recipe.sections.retention import KeepBest
from jobs.recipe.sections.tokenizer_source import tokenizer_source
from jobs.recipe.sections.trackers import Mlflow, Wandb

FORMAT = 2  # bump when a field changes meaning or is added; from_json refuses other formats
# Fields added since an older format, with the value that format meant: a stored recipe of
# that format loads with them (jobs stored before an upgrade still run and resume).
ADDED_SINCE: dict[int, dict[str, Any]] = {1: {"tokenizer": None, "wandb": None, "mlflow": None}}


class StoredRecipeInvalid(ValueError):
    """The JSON is not a recipe this code wrote (a missing key, another format)."""


@dataclass(frozen=True)
class TargetCall:
    """A callable from the allowlist and the keyword arguments the recipe gives it."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"_target_": self.target, **self.kwargs}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TargetCall:
        kwargs = {k: v for k, v in data.items() if k != "_target_"}
        return cls(str(data["_target_"]), kwargs)

    def text(self, key: str) -> str | None:
        """The keyword `key` as text, None when the recipe leaves it out or empty."""
        value = self.kwargs.get(key)
        return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class StepScheduler:
    # With max_steps and no num_epochs the trainer runs exactly max_steps, passing over the
    # data as often as needed. An explicit num_epochs also bounds it; without max_steps the
    # run is num_epochs passes (the count then comes from the data, reported at start).
    max_steps: int | None
    num_epochs: int | None
    global_batch_size: int
    local_batch_size: int
    grad_accumulation_steps: int
    val_check_interval: int | None
    checkpoint_interval: int | None
    log_interval: int
    # Added later, with the values older stored recipes meant: no checkpoint at an epoch's
    # end, and every train record to the trackers.
    save_checkpoint_every_epoch: bool = False
    log_remote_every_steps: int = 1


@dataclass(frozen=True)
class MixedPrecision:
    """FSDP2's mixed-precision policy (dtype names; `output_dtype` None keeps the output's)."""

    param_dtype: str | None  # None: the parameters' own dtype
    reduce_dtype: str
    output_dtype: str | None
    cast_forward_inputs: bool


@dataclass(frozen=True)
class PipelineSchedule:
    """How pipeline stages run: the schedule, its micro-batch size, whether torch scales the
    gradients by the micro-batch count, and the whole `distributed.pipeline` section (the
    stage split reads `layers_per_stage` and the virtual-stage rounding from it)."""

    schedule: str
    microbatch_size: int
    scale_grads_in_schedule: bool
    section: dict[str, Any]


@dataclass(frozen=True)
class Topology:
    """Where the job runs and how it is split: the resolved DistributedSetup.

    The strategy's own options are stored flat in `options`, every key written by
    validation; the properties below read them as typed settings for the trainer."""

    world_size: int
    nnodes: int
    nproc_per_node: int
    accelerator: str
    strategy: str
    dp_size: int
    dp_replicate_size: int
    dp_shard_size: int
    tp_size: int
    pp_size: int
    cp_size: int
    ep_size: int
    mesh_shape: dict[str, int]
    sequence_parallel: bool
    activation_checkpointing: bool | str  # False, or the mode ("full", "selective")
    options: dict[str, Any]  # the strategy's own keys (mp_policy, cpu_offload, ...)

    @property
    def mixed_precision(self) -> MixedPrecision | None:
        """FSDP2's `mp_policy`, or None to train in the model's dtype."""
        policy = self.options.get("mp_policy")
        if not policy:
            return None
        return MixedPrecision(
            param_dtype=policy["param_dtype"],
            reduce_dtype=policy["reduce_dtype"],
            output_dtype=policy["output_dtype"],
            cast_forward_inputs=policy["cast_forward_inputs"],
        )

    @property
    def reshard_after_forward(self) -> bool | None:
        """FSDP2's choice; None lets FSDP2 decide (reshard all but the root)."""
        return self.options.get("reshard_after_forward")

    @property
    def find_unused_parameters(self) -> bool:
        """DDP's `find_unused_parameters` (False for the other strategies)."""
        return bool(self.options.get("find_unused_parameters", False))

    @property
    def pipeline(self) -> PipelineSchedule | None:
        """The pipeline schedule when pp_size > 1 (validation then always writes one)."""
        section = self.options.get("pipeline")
        if self.pp_size <= 1 or not section:
            return None
        return PipelineSchedule(
            schedule=str(section["pp_schedule"]),
            microbatch_size=int(section["pp_microbatch_size"]),
            scale_grads_in_schedule=bool(section["scale_grads_in_schedule"]),
            section=dict(section),
        )

    def without_activation_checkpointing(self) -> Topology:
        """The same split with no activation checkpointing (a frozen KD teacher's)."""
        return dataclasses.replace(self, activation_checkpointing=False)


@dataclass(frozen=True)
class Rng:
    seed: int
    ranked: bool


@dataclass(frozen=True)
class DistEnv:
    backend: str | None
    timeout_minutes: int | None
    master_addr: str | None
    master_port: int | None


@dataclass(frozen=True)
class Compile:
    enabled: bool
    backend: str | None
    mode: str | None
    fullgraph: bool
    dynamic: bool | None

    @property
    def torch_backend(self) -> str:
        """The backend `torch.compile` gets: the recipe's, else torch's own default."""
        return self.backend or "inductor"


@dataclass(frozen=True)
class ClipGradNorm:
    max_norm: float | None


@dataclass(frozen=True)
class PackedSequence:
    enabled: bool
    packed_sequence_size: int  # 0: not packed
    split_across_pack: bool
    max_packs: int | None
    drop_long_samples: bool = False  # added later; stored recipes without it truncated


@dataclass(frozen=True)
class DataLoader:
    batch_size: int
    num_workers: int
    shuffle: bool
    drop_last: bool
    pin_memory: bool
    persistent_workers: bool
    collate_fn: str | None


@dataclass(frozen=True)
class Checkpoint:
    enabled: bool
    checkpoint_dir: str | None
    keep_last: int | None
    save_consolidated: bool
    model_save_format: str
    save_optimizer: bool
    is_async: bool = False  # added later: older stored recipes load without it
    keep_best: KeepBest | None = None  # added later, like is_async


@dataclass(frozen=True)
class Peft:
    target_modules: list[str] | None
    exclude_modules: list[str] | None
    match_all_linear: bool | None
    dim: int
    alpha: float
    dropout: float
    dropout_position: str
    use_dora: bool
    use_triton: bool
    moe_rank_scaling: bool = False  # expert adapters' rank dim // experts per token


@dataclass(frozen=True)
class Fp8:
    enabled: bool
    recipe_name: str
    enable_fsdp_float8_all_gather: bool
    precompute_float8_dynamic_scale_for_fsdp: bool
    force_recompute_fp8_weight_in_bwd: bool
    filter_fqns: list[str]
    emulate: bool


@dataclass(frozen=True)
class Qat:
    enabled: bool
    quantizer: str | dict[str, Any] | None
    fake_quant_after_n_steps: int | None
    groupsize: int | None


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's steps: `max_steps == warmup_steps + measured_steps`, warm-up unmeasured."""

    warmup_steps: int
    measured_steps: int
    peak_tflops: float | None  # per device; None: the trainer's device table


@dataclass(frozen=True)
class SpikeRule:
    factor: float  # a loss above factor x the median of the last `window` losses spikes
    window: int


@dataclass(frozen=True)
class Recovery:
    """`recovery:` (see `jobs.recipe.sections.recovery`); the default fails at a non-finite loss."""

    on_nan: str = "fail"  # "fail" or "rollback"
    on_spike: SpikeRule | None = None
    max_retries: int = 3
    lr_scale: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.on_nan == "rollback" or self.on_spike is not None


@dataclass(frozen=True)
class RestoreFrom:
    path: str  # LATEST or a checkpoint directory


@dataclass(frozen=True)
class Recipe:
    format: int
    recipe: str
    step_scheduler: StepScheduler
    topology: Topology
    rng: Rng
    dist_env: DistEnv
    compile: Compile
    clip_grad_norm: ClipGradNorm
    packed_sequence: PackedSequence
    dataloader: DataLoader
    validation_dataloader: DataLoader
    checkpoint: Checkpoint
    fp8: Fp8
    qat: Qat
    peft: Peft | None
    restore_from: RestoreFrom | None
    model: TargetCall
    loss_fn: TargetCall
    dataset: TargetCall
    validation_dataset: TargetCall | None
    optimizer: TargetCall
    lr_scheduler: TargetCall | None
    seq_length: int | None  # tokens per sample, where the dataset section says
    tokens_per_step: int | None
    teacher_model: TargetCall | None  # only for recipe: llm_kd, as kd_loss_fn and kd_ratio
    kd_loss_fn: TargetCall | None
    kd_ratio: float | None  # step loss = (1 - kd_ratio) * CE + kd_ratio * KD
    benchmark: Benchmark | None  # only for recipe: llm_benchmark
    tokenizer: TargetCall | None  # the recipe's own tokenizer section, if it has one
    wandb: Wandb | None  # trackers rank 0 logs to besides metrics.jsonl
    mlflow: Mlflow | None
    recovery: Recovery = Recovery()  # added later: older stored recipes load without it
    # Hub model name -> the commit validation read its config from; the trainer loads that
    # revision (`trainer.hub_models`). Added later, like `recovery`.
    hub_revisions: dict[str, str] = field(default_factory=dict)
    neftune: Neftune | None = None  # noisy input embeddings; added later, like `recovery`
    # near-zero input-embedding rows rewritten on the loaded model; added later, like `recovery`
    embedding_row_repair: EmbeddingRowRepair | None = None
    quantization: Quantization | None = None  # QLoRA's quantized base; added later, like `recovery`

    @property
    def model_source(self) -> str | None:
        """The model's directory or hub name; None for a model built from a config."""
        return self.model.text("pretrained_model_name_or_path")

    @property
    def tokenizer_source(self) -> str | None:
        """Where the tokenizer loads from without a `tokenizer:` section: a dataset's (or the
        model's) `tokenizer_name_or_path`, else the model's own files, else (a model built
        from a config) where that config comes from, as AutoModel finds it."""
        datasets = [c.kwargs for c in (self.dataset, self.validation_dataset) if c is not None]
        return tokenizer_source(self.model.kwargs, datasets)

    @property
    def pickled_weights(self) -> bool:
        """The model loads pickled `.bin` weights (`use_safetensors: false`, an operator's grant)."""
        return self.model.kwargs.get("use_safetensors") is False

    @property
    def trust_remote_code(self) -> bool:
        """The model's remote-code flag (validation refused it without the grants)."""
        return bool(self.model.kwargs.get("trust_remote_code"))

    def to_json(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recipe:
        data = _upgraded(data)
        try:
            return _load(cls, data, "")
        except (KeyError, TypeError) as exc:
            raise StoredRecipeInvalid(f"stored recipe is incomplete: {exc}") from None


def _upgraded(data: Any) -> dict[str, Any]:
    """A stored recipe of this format, or of an older one with its added fields filled in."""
    found = data.get("format") if isinstance(data, dict) else type(data).__name__
    if isinstance(data, dict) and data.get("format") in ADDED_SINCE:
        data = {**ADDED_SINCE[data["format"]], **data, "format": FORMAT}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StoredRecipeInvalid(f"not a tuneyard recipe of format {FORMAT} (found {found})")
    return data


SETUP_KEYS = (
    "strategy",
    "dp_size",
    "dp_replicate_size",
    "tp_size",
    "pp_size",
    "cp_size",
    "ep_size",
    "sequence_parallel",
    "activation_checkpointing",
)


def build_topology(
    distributed: dict[str, Any], mesh_shape: dict[str, int], resources: Any
) -> Topology:
    """The topology from the normalized `distributed` section and the job's resources."""
    return Topology(
        world_size=resources.world_size,
        nnodes=resources.nnodes,
        nproc_per_node=resources.nproc_per_node,
        accelerator=resources.accelerator,
        dp_shard_size=distributed["dp_size"] // distributed["dp_replicate_size"],
        mesh_shape=dict(mesh_shape),
        options={k: v for k, v in distributed.items() if k not in SETUP_KEYS},
        **{k: distributed[k] for k in SETUP_KEYS},
    )


def build_recipe(
    normalized: dict[str, Any], mesh_shape: dict[str, int], resources: Any, plan: dict[str, Any]
) -> Recipe:
    """The typed recipe from a normalized recipe that passed every check."""
    sections: dict[str, Any] = {
        "format": FORMAT,
        "recipe": normalized["recipe"],
        "topology": build_topology(normalized["distributed"], mesh_shape, resources),
        "seq_length": plan.get("seq_length"),
        "tokens_per_step": plan.get("tokens_per_step"),
        "kd_ratio": normalized.get("kd_ratio"),
    }
    for name, _, inner in _load_plan(Recipe):
        if name in sections:
            continue
        raw = normalized.get(name)
        sections[name] = raw if inner is None or raw is None else _load(inner, raw, f"{name}.")
    return Recipe(**sections)


DERIVED_KEYS = ("format", "topology", "seq_length", "tokens_per_step", "hub_revisions")


def is_stored_recipe(data: Any) -> bool:
    known = data.get("format") in (FORMAT, *ADDED_SINCE) if isinstance(data, dict) else False
    return known and "topology" in data


def recipe_sections(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored recipe written back as recipe sections, so it can be submitted again."""
    sections = {k: v for k, v in stored.items() if k not in DERIVED_KEYS}
    topology = stored["topology"]
    sections["distributed"] = {**{k: topology[k] for k in SETUP_KEYS}, **topology["options"]}
    return sections


def _dump(value: Any) -> Any:
    if type(value) in LEAVES:
        return value
    if isinstance(value, TargetCall):
        return value.to_json()
    names = field_names(type(value))
    if names is None:
        return value
    out = {}
    for name in names:
        item = getattr(value, name)
        out[name] = item if type(item) in LEAVES else _dump(item)
    return out


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (`X` or `X | None`), else None for plain JSON values."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) == 1:
            return _dataclass_of(members[0])
    return None


@cache
def _load_plan(cls: type) -> tuple[tuple[str, bool, type | None], ...]:
    """(name, has a default, the dataclass it holds) per field, worked out once per class."""
    hints = _hints(cls)
    return tuple(
        (f.name, _has_default(f), _dataclass_of(hints[f.name])) for f in dataclasses.fields(cls)
    )


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _load(cls: type, data: dict[str, Any], where: str) -> Any:
    if cls is TargetCall:
        return TargetCall.from_json(data)
    values = {}
    for name, has_default, inner in _load_plan(cls):
        if name not in data:
            if has_default:
                continue  # a field added later with the value older recipes meant (its default)
            raise KeyError(f"{where}{name}")
        raw = data[name]
        values[name] = raw if inner is None or raw is None else _load(inner, raw, f"{name}.")
    return cls(**values)
