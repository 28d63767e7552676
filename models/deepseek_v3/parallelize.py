"""DeepSeek-V3's parallel plan: expert parallelism and a tensor-parallel plan for latent attention.

FSDP units are the decoder layers, as for every family. Expert parallelism is the shared one
(`ExpertParallelMixin`: each `GroupedExperts` keeps E/ep experts of a 1-D `ep` mesh).

Tensor parallelism splits attention by heads: `q_proj` (or `q_b_proj` with a q LoRA rank)
and `kv_b_proj` colwise, `o_proj` rowwise. The low-rank down projections `q_a_proj` and
`kv_a_proj_with_mqa` and their norms stay replicated, so every rank computes the same
latents. The latents' gradients come back complete from the colwise projections (their
input redistribution sums the partial gradients), except for the single rotary key that
`kv_a_proj_with_mqa` emits for all heads: each rank uses it for its local heads only, so
`RopeKeyGradSum` sums that slice's gradient over the tensor-parallel ranks. Dense MLPs
(the first `first_k_dense_replace` layers) and the MoE blocks' shared experts are split as
the dense plan splits an MLP; the router and routed experts stay replicated (every rank
routes the same tokens to the same experts), so their gradients are complete on each rank.
With sequence parallelism the norms, embeddings and lm_head are handled as in the dense
plan, and a MoE block gathers the sequence on entry and keeps its shard on exit. Under
pipeline parallelism the plans apply to each stage, whose layers keep their full-model
indices as names (`models.common.pipeline_split.StageLayers`): the TP plan is keyed by those
names, and the stage's grouped experts spread over its pp rank's data-parallel ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel.style import ParallelStyle

from models.common.moe.parallelize import ExpertParallelMixin
from models.common.parallelize import (
    ParallelPlan,
    _embeddings_tied,
    _io_plan,
    _layers_prefix,
    _root_prefix,
)
from models.common.wrappers import unwrap_model
from models.deepseek_v3.layers import DeepseekV3MoE, MLAttention

_MLP = ("gate_proj", "up_proj", "down_proj")


class _SumTailGrad(torch.autograd.Function):
    """Identity forward; the backward sums the last-dim slice [start:] over the group."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, start: int, group: Any) -> torch.Tensor:
        ctx.start, ctx.group = start, group
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        tail = grad[..., ctx.start :].contiguous()
        dist.all_reduce(tail, group=ctx.group)
        grad[..., ctx.start :] = tail
        return grad, None, None


class RopeKeyGradSum(ParallelStyle):
    """On `kv_a_proj_with_mqa`: sum the rotary key's gradient over the tp ranks."""

    def __init__(self, latent_dim: int) -> None:
        self.latent_dim = latent_dim

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        group, start = device_mesh.get_group(), self.latent_dim
        module.register_forward_hook(lambda _m, _i, out: _SumTailGrad.apply(out, start, group))
        return module


def _attention_plan(layer: str, attn: MLAttention, sequence_parallel: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        SequenceParallel,
    )

    plan: dict[str, Any] = {}
    if sequence_parallel:
        for norm in ("input_layernorm", "post_attention_layernorm"):
            plan[f"{layer}.{norm}"] = SequenceParallel(use_local_output=False)
        plan[f"{layer}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=True,
        )
    query = "q_proj" if attn.q_lora_rank is None else "q_b_proj"
    plan[f"{layer}.self_attn.{query}"] = ColwiseParallel()
    plan[f"{layer}.self_attn.kv_b_proj"] = ColwiseParallel()
    plan[f"{layer}.self_attn.kv_a_proj_with_mqa"] = RopeKeyGradSum(attn.kv_lora_rank)
    plan[f"{layer}.self_attn.o_proj"] = _rowwise(sequence_parallel)
    return plan


def _rowwise(sequence_parallel: bool) -> Any:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    if sequence_parallel:
        return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    return RowwiseParallel()


def _mlp_plan(layer: str, mlp: nn.Module, sequence_parallel: bool) -> dict[str, Any]:
    """A dense MLP split colwise/rowwise; a MoE block's shared experts likewise, its router
    and routed experts replicated (the block's output is complete on every rank)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
    )

    sparse = isinstance(mlp, DeepseekV3MoE)
    prefix = f"{layer}.mlp.shared_experts" if sparse else f"{layer}.mlp"
    plan: dict[str, Any] = {
        f"{prefix}.gate_proj": ColwiseParallel(),
        f"{prefix}.up_proj": ColwiseParallel(),
        f"{prefix}.down_proj": RowwiseParallel() if sparse else _rowwise(sequence_parallel),
    }
    if sequence_parallel and sparse:
        plan[f"{layer}.mlp"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_output=False,
        )
    elif sequence_parallel:
        plan[f"{layer}.mlp"] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    return plan


def _mlp_of(layer: nn.Module) -> nn.Module:
    mlp = layer.mlp
    return mlp.shared_experts if isinstance(mlp, DeepseekV3MoE) else mlp


class DeepseekV3ParallelPlan(ExpertParallelMixin, ParallelPlan):
    """Decoder-layer FSDP units, expert parallelism, and the latent-attention TP plan."""

    def tp_unsupported_reason(self, model: nn.Module, tp_size: int | None = None) -> str | None:
        inner = unwrap_model(model)
        found = _layers_prefix(inner)
        if found is None or not len(found[1]):
            return f"{type(inner).__name__} has no decoder `layers` list"
        layers = found[1]
        if not all(isinstance(layer.self_attn, MLAttention) for layer in layers):
            return f"{type(inner).__name__} is not the native latent-attention class"
        linears = [m for layer in layers for m in (layer.self_attn, _mlp_of(layer))]
        if any(hasattr(child, "base_layer") for m in linears for child in m.children()):
            return "LoRA-wrapped projections cannot be tensor-parallel sharded; use tp_size: 1"
        if not all(
            isinstance(getattr(_mlp_of(layer), p, None), nn.Linear)
            for layer in layers
            for p in _MLP
        ):
            return f"{type(inner).__name__} MLPs are not gate/up/down linears"
        heads = int(inner.config.num_attention_heads)
        if tp_size and heads % tp_size:
            return f"attention heads ({heads}) must be divisible by tp_size {tp_size}"
        return None

    def tp_plan(self, model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
        reason = self.tp_unsupported_reason(model)
        if reason:
            raise ValueError(f"tensor parallelism unavailable: {reason}")
        inner = unwrap_model(model)
        prefix, layers = _layers_prefix(inner)
        root = _root_prefix(model, inner)
        plan: dict[str, Any] = {}
        if sequence_parallel:
            base = root + prefix.rsplit(".", 1)[0] + "." if "." in prefix else root
            plan.update(_io_plan(root, base, _embeddings_tied(inner)))
        for index, layer in layers.named_children():  # a stage's: full-model indices
            name = f"{root}{prefix}.{index}"
            plan.update(_attention_plan(name, layer.self_attn, sequence_parallel))
            plan.update(_mlp_plan(name, layer.mlp, sequence_parallel))
        return plan


DEEPSEEK_V3_PLAN = DeepseekV3ParallelPlan()
