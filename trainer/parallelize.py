"""Sharding a built model: tensor parallel, activation checkpointing, FSDP2 or DDP, compile.

One function, `parallelize`, asks `models.hooks.parallel_plan` for the model family's plan
(the trainer holds no family knowledge, so a new model never edits this file) and applies
the steps in a fixed order: move to the device; tensor parallelism on the mesh's `tp` axis
with the plan's DTensor plan, first, because `parallelize_module` needs the plain modules
(after PEFT: the plan places a LoRA projection's base layer and adapters consistently);
expert parallelism over groups of ep_size data-parallel (x context-parallel) ranks, before
FSDP2, which leaves the expert DTensors alone (ep == dp x cp) or shards them over the ranks
that hold the same experts; context parallelism (the attention layers attend over the `cp` axis, and FSDP2
shards over dp_shard x cp); activation checkpointing per decoder layer, so each FSDP unit
wraps a checkpointed layer; then data parallelism: FSDP2 (`fully_shard` per FSDP unit of
the plan, then the root; a `MixedPrecisionPolicy` on CUDA only) or DDP. An FSDP2 group
reduces gradients in one dtype, so parameters a family keeps in another dtype (an fp32
router in a bf16 model) become groups of their own first (`dtype_groups`).
The model is compiled last, so it traces the sharded modules. `clip_grad_norm` handles
gradients that live on different meshes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn.parallel import DistributedDataParallel

from jobs.recipe.typed import Compile, MixedPrecision
from jobs.recipe.typed import Topology as Layout
from models import hooks
from models.common.parallelize import ParallelPlan, lora_on_sequence_parallel_ends
from models.common.wrappers import unwrap_model
from models.registry import LORA_TP_PLANS, resolve_reference
from trainer.context_parallel import apply_context_parallel
from trainer.distributed import Topology
from trainer.errors import data_error, unsupported
from trainer.qlora import quantized_params

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def apply_tensor_parallel(
    model: nn.Module, plan: ParallelPlan, topology: Topology, sequence_parallel: bool
) -> None:
    reason = plan.tp_unsupported_reason(model, topology.tp_size)
    if reason:
        raise unsupported(f"distributed.tp_size: {reason}; set distributed.tp_size: 1")
    places_lora = any(plan is resolve_reference(name) for name in LORA_TP_PLANS)
    if not places_lora and any(hasattr(m, "lora_A") for m in model.modules()):
        # only these plans place LoRA adapters beside their sharded projections
        raise unsupported(
            f"distributed.tp_size: LoRA with tensor parallelism needs a plan that places "
            f"the adapters, and {type(plan).__name__} shards its own way; set "
            "distributed.tp_size: 1"
        )
    ends = lora_on_sequence_parallel_ends(model) if sequence_parallel else []
    if ends:
        raise unsupported(
            f"distributed.sequence_parallel: LoRA on {ends[0]} cannot be sharded with "
            "sequence parallelism; set it to false or leave lm_head and embed_tokens out of "
            "peft.target_modules"
        )
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    parallelize_module(model, topology.tp_mesh, plan.tp_plan(model, sequence_parallel))
    # Some styles (SequenceParallel on the norms) re-register parameters as trainable; a
    # LoRA run's frozen base must stay frozen.
    for name, param in model.named_parameters():
        param.requires_grad_(trainable[name])


@dataclass(frozen=True)
class ExpertShards:
    """What expert parallelism leaves to FSDP2: the expert DTensors (`Shard(0)` over the
    `ep` ranks) and, when ep_size < dp_size, the mesh of the dp / ep ranks that hold the
    same experts (`expert_dp_mesh`, the expert-data-parallel ranks r, r + ep, ...)."""

    params: list[nn.Parameter]
    expert_dp_mesh: DeviceMesh | None = None


def expert_meshes(topology: Topology) -> tuple[DeviceMesh, DeviceMesh | None]:
    """(ep mesh, expert-data-parallel mesh) over the ranks FSDP2 shards over: the
    data-parallel ranks, with their context-parallel peers when cp > 1 (a MoE layer routes
    tokens, whichever slice of the sequence they come from). ep peers are adjacent ranks.
    With ep_size == that span every such rank is an ep peer and no two ranks hold the same
    experts (None). The span is one axis here: validation refuses ep with dp_replicate or
    tp. Under pipeline parallelism `fsdp_mesh` is this pp rank's sub-mesh, so each stage's
    experts spread over the ranks holding that stage. (`_unflatten` is DeviceMesh's way to
    split an axis into sub-axes that FSDP2 can combine with the experts' DTensor mesh.)"""
    ep, span = topology.ep_size, topology.dp_size * topology.cp_size
    if ep == span:
        return topology.fsdp_mesh, None
    mesh = topology.fsdp_mesh._unflatten(0, (span // ep, ep), ("edp", "ep"))
    return mesh["ep"], mesh["edp"]


def ep_spans_dp_axis(topology: Topology) -> bool:
    """Expert parallelism runs over the one data-parallel (x context-parallel) axis:
    ep_size divides dp_size x cp_size. Under pipeline parallelism that axis is the pp
    rank's own: each stage spreads its experts over the ranks that hold the stage."""
    names = topology.mesh.mesh_dim_names or ()
    other_axes = topology.tp_size > 1
    span = topology.dp_size * topology.cp_size
    return not other_axes and "dp_replicate" not in names and span % topology.ep_size == 0


def apply_expert_parallel(model: nn.Module, plan: ParallelPlan, topology: Topology) -> ExpertShards:
    """Spread the experts over the ep ranks; returns them for FSDP2 (`apply_fsdp2`).

    A local expert's gradient is that of the sum of its ep group's losses, while FSDP
    averages the other gradients over the dp ranks. With ep == dp the experts stay out of
    FSDP2 and a hook divides their gradients by ep_size; otherwise FSDP2 shards them over
    the expert-data-parallel ranks and divides their summed gradients by dp_size. Either
    way they follow the trainer's loss convention (local loss x dp_size / global label
    count).
    """
    reason = plan.ep_unsupported_reason(model, topology.ep_size)
    if reason:
        raise unsupported(f"distributed.ep_size: {reason}; set distributed.ep_size: 1")
    ep_mesh, expert_dp_mesh = expert_meshes(topology)
    params = plan.apply_expert_parallel(model, ep_mesh)
    if expert_dp_mesh is None:
        scale = 1.0 / topology.ep_size
        for param in params:
            if param.requires_grad:
                param.register_hook(lambda grad: grad * scale)
    return ExpertShards(params, expert_dp_mesh)


def apply_activation_checkpointing(model: nn.Module, plan: ParallelPlan, mode: bool | str) -> None:
    """'full'/True wraps every decoder layer; 'selective' wraps every second layer."""
    if not mode:
        return
    every = 2 if mode == "selective" else 1
    try:
        container = plan.decoder_layer_list(model)
    except ValueError as exc:
        # the checkpoint's structure, which the recipe cannot show: a data error
        raise data_error(
            f"model: {exc}; activation checkpointing wraps decoder layers, so set "
            "distributed.activation_checkpointing: false for this model"
        ) from None
    for index in range(0, len(container), every):
        container[index] = checkpoint_wrapper(container[index], preserve_rng_state=True)


def _mp_policy(config: MixedPrecision | None, device: torch.device) -> MixedPrecisionPolicy:
    if config is None:
        return MixedPrecisionPolicy()
    if device.type != "cuda":
        print(
            "distributed.mp_policy applies on CUDA only; training in the model dtype on CPU",
            file=sys.stderr,
        )
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(
        param_dtype=_DTYPES[config.param_dtype] if config.param_dtype else None,
        reduce_dtype=_DTYPES[config.reduce_dtype],
        output_dtype=_DTYPES[config.output_dtype] if config.output_dtype else None,
        cast_forward_inputs=config.cast_forward_inputs,
    )


def apply_fsdp2(
    model: nn.Module,
    plan: ParallelPlan,
    topology: Topology,
    layout: Layout,
    device: torch.device,
    experts: ExpertShards | None = None,
) -> None:
    expert_dp = experts is not None and experts.expert_dp_mesh is not None
    ignored = quantized_params(model)  # QLoRA's quantized weights stay whole on every rank
    if experts and not expert_dp:  # experts spread over ep ranks, no expert-dp group
        ignored |= set(experts.params)
    options = dict(
        mesh=topology.fsdp_mesh,
        mp_policy=_mp_policy(layout.mixed_precision, device),
        reshard_after_forward=layout.reshard_after_forward,
        ignored_params=ignored or None,
    )
    try:
        units = plan.fsdp_units(model)
    except ValueError as exc:
        raise data_error(
            f"model: {exc}; FSDP2 shards per decoder layer, so use distributed.strategy: ddp"
        ) from None
    if expert_dp:  # every rank's loss is scaled by dp_size x cp_size (`trainer.finetune`)
        _shard_experts(model, experts, options, topology.dp_size * topology.cp_size)
    embedding, head = _untied_ends(model)
    if embedding is not None:
        _shard_unit(embedding, options)
    for unit in units:
        _shard_unit(unit, options)
    if head is not None:  # used last in forward, first in backward: kept gathered between
        keep = options["reshard_after_forward"]
        _shard_unit(head, {**options, "reshard_after_forward": bool(keep)})
    _shard_unit(model, options)


def _shard_experts(
    model: nn.Module, experts: ExpertShards, options: dict[str, Any], dp_size: int
) -> None:
    """Each experts module an FSDP2 group over the expert-data-parallel ranks (the ranks
    holding the same experts), sharded there before its decoder layer is.

    Its gradient on a rank is that of its ep group's summed losses, so the sum over the
    expert-dp ranks is divided by `dp_size` (the data-parallel x context-parallel ranks whose
    losses the step averages), not by their number. It runs as a SUM collective
    (gloo has no pre-multiplied sum); a one-rank group has no collective and divides once.
    """
    ids = {id(p) for p in experts.params}
    modules = [m for m in model.modules() if any(id(p) in ids for p in m.parameters(False))]
    for module in modules:
        fully_shard(module, **{**options, "mesh": experts.expert_dp_mesh})
        module.set_gradient_divide_factor(float(dp_size))
        if experts.expert_dp_mesh.size() > 1:
            module.set_force_sum_reduction_for_comms(True)


def _shard_unit(unit: nn.Module, options: dict[str, Any]) -> None:
    """`fully_shard(unit)`, after its sub-modules of another dtype (`dtype_groups`) became
    FSDP2 groups of their own: one group reduces its gradients in one dtype, so it must hold
    trainable parameters of one dtype. A split-off group computes in its stored dtype (no
    mixed-precision cast): a family keeps a router or attention sinks in fp32 on purpose."""
    own_dtype = MixedPrecisionPolicy(
        reduce_dtype=options["mp_policy"].reduce_dtype, cast_forward_inputs=False
    )
    for group in dtype_groups(unit, set(options["ignored_params"] or ())):
        fully_shard(group, **{**options, "mp_policy": own_dtype})
    fully_shard(unit, **options)


def dtype_groups(unit: nn.Module, ignored: set[nn.Parameter]) -> list[nn.Module | list[nn.Module]]:
    """The sub-modules of `unit` to shard before it, innermost first, so that every FSDP2
    group (each of them, and `unit` with what remains) holds trainable parameters of one
    dtype. A module keeps the dtype of its own parameters, or else the dtype most of its
    parameters have; the parameters of another dtype below it become groups, each the
    smallest module holding them (a router, not the MoE block around it). Sub-modules
    already sharded, frozen and `ignored` parameters do not count."""
    groups: list[nn.Module | list[nn.Module]] = []
    _remaining(unit, ignored, groups)
    return groups


@dataclass(frozen=True)
class _Remaining:
    """A module's trainable parameters not yet in a group: their one dtype, count, and the
    smallest module under it that holds them all (`holder`)."""

    dtype: torch.dtype
    numel: int
    holder: nn.Module


def _remaining(
    module: nn.Module, ignored: set[nn.Parameter], groups: list[nn.Module | list[nn.Module]]
) -> _Remaining | None:
    own = [p for p in module.parameters(recurse=False) if p.requires_grad and p not in ignored]
    if len({p.dtype for p in own}) > 1:  # the checkpoint's structure: a data error
        raise data_error(
            f"model: {type(module).__name__} holds trainable parameters of dtypes "
            f"{sorted({str(p.dtype) for p in own})} itself, and FSDP2 shards a module's own "
            "parameters as one group of one dtype; set model.dtype: float32"
        )
    below = [
        found
        for child in module.children()
        if not isinstance(child, FSDPModule)
        and (found := _remaining(child, ignored, groups)) is not None
    ]
    numel = {p.dtype: 0 for p in own}
    for p in own:
        numel[p.dtype] += p.numel()
    for found in below:
        numel[found.dtype] = numel.get(found.dtype, 0) + found.numel
    if not numel:
        return None
    keep = own[0].dtype if own else max(numel, key=numel.__getitem__)
    for dtype in numel:  # siblings of one dtype form one group: one all-gather, not several
        holders = [found.holder for found in below if found.dtype == dtype != keep]
        if holders:
            groups.append(holders[0] if len(holders) == 1 else holders)
    kept = [found for found in below if found.dtype == keep]
    if not own and len(kept) == 1:
        return kept[0]
    return _Remaining(keep, numel[keep], module)


def _untied_ends(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """The input embedding and output head as FSDP2 units of their own when they are untied
    plain modules: the root then gathers neither for the whole step (each is the size of a
    vocabulary times the hidden size, often the largest tensors of a model). Tied, wrapped
    (LoRA on the head) or absent (a pipeline stage) ends stay in the root."""
    try:
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    plain = (
        type(embedding) is nn.Embedding
        and type(head) is nn.Linear
        and head.weight is not embedding.weight
    )
    return (embedding, head) if plain else (None, None)


def row_refusal(model: nn.Module, layout: Layout) -> str | None:
    """The split the family's registry row does not support (validation read the same row;
    this guards a model whose files changed after it), else None."""
    caps = hooks.capabilities(model)
    name = type(unwrap_model(model)).__name__
    for field, size, supported in (
        ("tp_size", layout.tp_size, caps.supports_tp),
        ("pp_size", layout.pp_size, caps.supports_pp),
        ("cp_size", layout.cp_size, caps.supports_cp),
        ("ep_size", layout.ep_size, caps.supports_ep),
    ):
        if size > 1 and not supported:
            return f"distributed.{field}: {name} does not support it; set distributed.{field}: 1"
    if layout.sequence_parallel and not caps.supports_sequence_parallel:
        return f"distributed.sequence_parallel: {name} does not support it; set it to false"
    return None


def parallelize(
    model: nn.Module,
    topology: Topology,
    layout: Layout,
    device: torch.device,
    compile_settings: Compile | None,
) -> nn.Module:
    """Shard `model` in place and return the module to call (DDP- or compile-wrapped).

    A model on the meta device (shard-only load) stays there: its caller allocates the
    local shards once the parameters are DTensors, then fills them.
    """
    if not any(p.is_meta for p in model.parameters()):
        model.to(device)
    plan = hooks.parallel_plan(model)
    refusal = row_refusal(model, layout)
    if refusal:
        raise unsupported(refusal)
    if topology.tp_size > 1:
        apply_tensor_parallel(model, plan, topology, layout.sequence_parallel)
    strategy = layout.strategy
    experts: ExpertShards | None = None
    if topology.ep_size > 1:
        if strategy != "fsdp2":
            raise unsupported("distributed.ep_size > 1 needs strategy: fsdp2")
        if not ep_spans_dp_axis(topology):
            raise unsupported(
                f"distributed.ep_size: {topology.ep_size} must divide dp_size x cp_size "
                f"({topology.dp_size * topology.cp_size}) with tp, pp and dp_replicate sizes 1"
            )
        experts = apply_expert_parallel(model, plan, topology)
    if topology.cp_size > 1:
        apply_context_parallel(model, topology)
    apply_activation_checkpointing(model, plan, layout.activation_checkpointing)
    forward_model: nn.Module = model
    if strategy == "fsdp2":
        apply_fsdp2(model, plan, topology, layout, device, experts)
    elif strategy == "ddp" and topology.dp_size > 1:
        if topology.tp_size > 1:
            raise unsupported(
                "distributed.strategy ddp cannot combine with tp_size > 1; use strategy: fsdp2"
            )
        forward_model = DistributedDataParallel(
            model,
            process_group=topology.dp_mesh.get_group(),
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=layout.find_unused_parameters,
        )
    elif strategy not in ("ddp", "fsdp2"):
        raise unsupported(
            f"distributed.strategy {strategy!r} is not supported by this trainer; use fsdp2 or ddp"
        )
    if compile_settings is not None and compile_settings.enabled:
        forward_model = torch.compile(forward_model, backend=compile_settings.torch_backend)
    return forward_model


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float | None) -> float:
    """Global L2 norm of all gradients (DTensors grouped by mesh), clipped to `max_norm`."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is None:
            continue
        key = (
            (id(p.grad.device_mesh), p.grad.placements)
            if isinstance(p.grad, DTensor)
            else ("local", p.grad.device)
        )
        groups.setdefault(key, []).append(p.grad)
    total_sq = 0.0
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq += float(norm) ** 2
    total = total_sq**0.5
    if max_norm is not None and max_norm > 0 and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for grads in groups.values():
            for g in grads:
                g.mul_(scale)
    return total
