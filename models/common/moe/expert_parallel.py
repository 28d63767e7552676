"""Expert parallelism for the grouped experts: each rank of an `ep` mesh keeps E/ep experts.

`shard_experts(experts, mesh)` replaces the `[E, ...]` expert tensors by DTensors
`Shard(0)` on the 1-D `mesh`, whose local piece on rank r is experts
[r*E/ep, (r+1)*E/ep) in expert order, so `full_tensor()` (checkpoint consolidation), DCP
and gradient-norm clipping see the whole model. `expert_parallel_forward` runs one MoE
block: every rank routes its own tokens, the tokens, routing weights and expert ids are
gathered over the mesh, each rank applies only its local experts to all tokens, and the
contributions are summed over the mesh; a rank keeps the rows of its own tokens. The
backward pass returns every token's gradient to its rank and
gives each local expert the gradient of the SUM of all ranks' losses. The gathers and
the sum are zero-padded sum all-reduces (`_AllReduceSum`, whose backward is the same
all-reduce of the gradients; gloo has it). An experts module names its `[E, ...]` tensors
in `expert_tensor_names` and runs one expert with `expert_forward(chunk, *its slices)`
(the bias-free SwiGLU of `GroupedExperts` by default; gpt-oss's experts add biases and a
clamped activation).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

EXPERT_TENSORS = ("gate_proj", "up_proj", "down_proj")


def expert_tensor_names(experts: nn.Module) -> tuple[str, ...]:
    """The module's `[num_experts, ...]` parameters, in `expert_forward` argument order."""
    return tuple(getattr(experts, "expert_tensor_names", EXPERT_TENSORS))


def swiglu_expert(experts: nn.Module, chunk: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU on its tokens: down(act(gate(x)) * up(x)), no biases."""
    gate, up, down = tensors
    return (experts.act_fn(chunk @ gate.T) * (chunk @ up.T)) @ down.T


def shard_experts(experts: nn.Module, mesh: Any) -> list[nn.Parameter]:
    """Keep this rank's contiguous slice of experts as `Shard(0)` DTensors; returns them."""
    ep, rank = mesh.size(), mesh.get_local_rank()
    if experts.num_experts % ep:
        raise ValueError(f"num_experts {experts.num_experts} is not divisible by ep_size {ep}")
    per_rank = experts.num_experts // ep
    start = rank * per_rank
    params = []
    for name in expert_tensor_names(experts):
        full = getattr(experts, name)
        local = full.detach()[start : start + per_rank].clone()
        sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        param = nn.Parameter(sharded, requires_grad=full.requires_grad)
        setattr(experts, name, param)
        params.append(param)
    experts.ep_mesh = mesh
    experts.local_experts = (start, start + per_rank)
    return params


class _AllReduceSum(torch.autograd.Function):
    """Sum over the group; the gradient of every rank's input is the summed gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _AllReduceSum.apply(grad, ctx.group), None


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _gather_rows(local: torch.Tensor, sizes: list[int], rank: int, group: Any) -> torch.Tensor:
    """All ranks' rows in rank order: this rank's rows in a zero buffer, summed over ranks."""
    before, after = sum(sizes[:rank]), sum(sizes[rank + 1 :])
    pad = local.shape[1:]
    padded = torch.cat([local.new_zeros(before, *pad), local, local.new_zeros(after, *pad)])
    if local.requires_grad:
        return _AllReduceSum.apply(padded, group)
    dist.all_reduce(padded, group=group)
    return padded


def _row_counts(rows: int, mesh: Any, device: torch.device) -> list[int]:
    counts = torch.zeros(mesh.size(), dtype=torch.int64, device=device)
    counts[mesh.get_local_rank()] = rows
    dist.all_reduce(counts, group=mesh.get_group())
    return counts.tolist()


def local_expert_output(
    experts: nn.Module, flat: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The weighted output of this rank's experts for every token (zero rows elsewhere)."""
    start, stop = experts.local_experts
    tensors = [_local(getattr(experts, n)) for n in expert_tensor_names(experts)]
    run_expert = getattr(experts, "expert_forward", None) or (
        lambda chunk, *ts: swiglu_expert(experts, chunk, *ts)
    )
    slot_token, slot_k = ((ids >= start) & (ids < stop)).nonzero(as_tuple=True)
    local_ids = ids[slot_token, slot_k] - start
    order = local_ids.argsort(stable=True)
    token_of = slot_token[order]
    slot_weight = weights[slot_token, slot_k][order]
    counts = torch.bincount(local_ids, minlength=stop - start).tolist()
    outputs = []
    for expert, chunk in enumerate(flat[token_of].split(counts)):
        outputs.append(run_expert(chunk, *(t[expert] for t in tensors)))
    routed = torch.cat(outputs) * slot_weight[:, None]
    return torch.zeros_like(flat).index_add(0, token_of, routed.to(flat.dtype))


def expert_parallel_forward(
    experts: nn.Module, flat: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """One MoE block's routed output for this rank's tokens, experts spread over the mesh."""
    mesh = experts.ep_mesh
    group, rank = mesh.get_group(), mesh.get_local_rank()
    sizes = _row_counts(flat.shape[0], mesh, flat.device)
    all_flat = _gather_rows(flat, sizes, rank, group)
    all_weights = _gather_rows(weights, sizes, rank, group)
    all_ids = _gather_rows(ids, sizes, rank, group)
    contribution = local_expert_output(experts, all_flat, all_weights, all_ids)
    summed = _AllReduceSum.apply(contribution, group)
    start = sum(sizes[:rank])
    return summed[start : start + flat.shape[0]]
