"""Sharding a built model: tensor parallel, activation checkpointing, FSDP2 or DDP, compile.

One function, `parallelize`, asks `models.hooks.parallel_plan` for the model family's plan
(the trainer holds no family knowledge, so a new model never edits this file) and applies
the steps in a fixed order: move to the device; tensor parallelism on the mesh's `tp` axis
with the plan's DTensor plan, first, because `parallelize_module` needs the plain modules;
expert parallelism over the data-parallel ranks, before FSDP2, which must be told to leave
the expert DTensors alone; context parallelism (the attention layers attend over the `cp`
axis, and FSDP2 shards over dp_shard x cp); activation checkpointing per decoder layer,
so each FSDP unit wraps a checkpointed layer; then data parallelism: FSDP2 (`fully_shard`
per FSDP unit of the plan, then the root; a `MixedPrecisionPolicy` on CUDA only) or DDP.
The model is compiled last, so it traces the sharded modules. `clip_grad_norm` handles
gradients that live on different meshes.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn.parallel import DistributedDataParallel

from jobs.recipe.typed import Compile, MixedPrecision
from jobs.recipe.typed import Topology as Layout
from models import hooks
from models.common.parallelize import ParallelPlan
from models.common.wrappers import unwrap_model
from trainer.context_parallel import apply_context_parallel
from trainer.distributed import Topology
from trainer.errors import data_error, unsupported

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def apply_tensor_parallel(
    model: nn.Module, plan: ParallelPlan, topology: Topology, sequence_parallel: bool
) -> None:
    reason = plan.tp_unsupported_reason(model, topology.tp_size)
    if reason:
        raise unsupported(f"distributed.tp_size: {reason}; set distributed.tp_size: 1")
    parallelize_module(model, topology.tp_mesh, plan.tp_plan(model, sequence_parallel))


def apply_expert_parallel(
    model: nn.Module, plan: ParallelPlan, topology: Topology
) -> set[nn.Parameter]:
    """Spread the experts over the dp ranks; returns the expert parameters FSDP must ignore.

    A local expert's gradient is that of the sum of the ep ranks' losses, while FSDP
    averages the other gradients over the same ranks: a hook divides by ep_size so both
    follow the trainer's loss convention (local loss x dp_size / global label count).
    """
    reason = plan.ep_unsupported_reason(model, topology.ep_size)
    if reason:
        raise unsupported(f"distributed.ep_size: {reason}; set distributed.ep_size: 1")
    params = plan.apply_expert_parallel(model, topology.dp_mesh)
    scale = 1.0 / topology.ep_size
    for param in params:
        if param.requires_grad:
            param.register_hook(lambda grad: grad * scale)
    return set(params)


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
        param_dtype=_DTYPES[config.param_dtype],
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
    ignored: set[nn.Parameter] | None = None,
) -> None:
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
    embedding, head = _untied_ends(model)
    if embedding is not None:
        fully_shard(embedding, **options)
    for unit in units:
        fully_shard(unit, **options)
    if head is not None:  # used last in forward, first in backward: kept gathered between
        keep = options["reshard_after_forward"]
        fully_shard(head, **{**options, "reshard_after_forward": bool(keep)})
    fully_shard(model, **options)


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
    experts: set[nn.Parameter] = set()
    if topology.ep_size > 1:
        if strategy != "fsdp2":
            raise unsupported("distributed.ep_size > 1 needs strategy: fsdp2")
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
