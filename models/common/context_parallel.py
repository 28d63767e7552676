"""Context parallelism for the native attention: all-gather K/V, attend causally, reduce-scatter.

Each of the `size` ranks of a context-parallel group holds a load-balanced slice of every
sequence: the sequence is cut into `2 * size` equal chunks and rank r keeps chunks r and
`2 * size - 1 - r`, so every rank attends over the same number of (query, key) pairs under
the causal mask. `sequence_indices` says which positions those are; the trainer shards
input ids, labels and position ids with it, so RoPE rotates each local token by its global
position. In attention, `_GatherSequence` all-gathers the local K and V into the whole
sequence in global order; its backward sums every rank's dK/dV and hands each rank the part
for its own tokens (a reduce-scatter). Each local chunk then attends to the key prefix up to
its own end with a causal mask shifted by the chunk's global offset.

Only torch.distributed collectives are used (all_gather, reduce_scatter_tensor), so this
runs on gloo (CPU) as well as NCCL (CUDA). Padding and packed-document masks are not
supported: under context parallelism attention is plain causal over whole rows, which is
exact for right-padded rows (a real token never attends to a later pad) and is why the
recipe rules refuse packed sequences with `cp_size > 1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from models.common.layers import Attention


def sequence_indices(seq_len: int, rank: int, size: int, device: Any = None) -> torch.Tensor:
    """Global positions rank `rank` of `size` keeps: chunks rank and 2*size-1-rank, in order."""
    if seq_len % (2 * size):
        raise ValueError(f"sequence length {seq_len} is not a multiple of 2 * cp_size ({2 * size})")
    chunk = seq_len // (2 * size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second_start = (2 * size - 1 - rank) * chunk
    return torch.cat([first, torch.arange(second_start, second_start + chunk, device=device)])


def _to_global_order(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Rank-ordered local slices (each two chunks) -> the whole sequence in position order."""
    halves = [part.chunk(2, dim=dim) for part in parts]
    firsts = [first for first, _ in halves]
    seconds = [second for _, second in reversed(halves)]
    return torch.cat(firsts + seconds, dim=dim)


def _to_rank_order(whole: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The whole sequence -> (size, ...) stacked so that entry r is rank r's two chunks."""
    chunks = whole.chunk(2 * size, dim=dim)
    return torch.stack(
        [torch.cat([chunks[r], chunks[2 * size - 1 - r]], dim=dim) for r in range(size)]
    )


class _GatherSequence(torch.autograd.Function):
    """All-gather local slices along `dim` into the whole sequence; backward reduce-scatters."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any, size: int, dim: int) -> torch.Tensor:
        ctx.group, ctx.size, ctx.dim = group, size, dim
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local, group=group)
        return _to_global_order(parts, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # Every rank's queries read every rank's keys: sum the gradients over the group,
        # each rank receiving the sum for its own two chunks.
        stacked = _to_rank_order(grad, ctx.size, ctx.dim).contiguous()
        local = torch.empty_like(stacked[0])
        dist.reduce_scatter_tensor(local, stacked.flatten(0, 1), group=ctx.group)
        return local, None, None, None


@dataclass(frozen=True)
class ContextParallel:
    """One rank's place in a context-parallel group, and the attention it computes there."""

    group: Any
    rank: int
    size: int

    def gather(self, local: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """The whole sequence from every rank's slice (differentiable across ranks)."""
        return _GatherSequence.apply(local, self.group, self.size, dim)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dropout_p: float
    ) -> torch.Tensor:
        """Causal attention of the local queries over the whole sequence's keys.

        q, k, v: (batch, heads, local_seq, head_dim), the local slice of two chunks each;
        k and v may have fewer heads (grouped-query attention). Returns q's shape.
        """
        # one collective for both (and one reduce-scatter for dK and dV in backward)
        k_all, v_all = self.gather(torch.cat([k, v], dim=1)).split(k.shape[1], dim=1)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # masked attention with grouped heads falls back to math kernels
            k_all, v_all = _repeat_heads(k_all, groups), _repeat_heads(v_all, groups)
        chunk = q.shape[2] // 2
        outputs = []
        for half, index in enumerate((self.rank, 2 * self.size - 1 - self.rank)):
            query = q[:, :, half * chunk : (half + 1) * chunk]
            end = (index + 1) * chunk  # keys past the chunk's end are all in the future
            mask = None
            if index > 0:
                mask = torch.ones(chunk, end, dtype=torch.bool, device=q.device)
                mask = mask.tril(diagonal=index * chunk)
            outputs.append(
                F.scaled_dot_product_attention(
                    query,
                    k_all[:, :, :end],
                    v_all[:, :, :end],
                    attn_mask=mask,
                    is_causal=mask is None,
                    dropout_p=dropout_p,
                    scale=scale,
                )
            )
        return torch.cat(outputs, dim=2)


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    batch, heads, seq, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, seq, dim).reshape(batch, -1, seq, dim)


def enable_context_parallel(model: nn.Module, group: Any) -> int:
    """Make every native attention layer of `model` attend context-parallel over `group`.

    Returns how many layers it set (0: the model has no native attention, e.g. a Hugging
    Face fallback class, and cannot run context parallel). Raises ValueError for layers
    with a sliding window.
    """
    windowed = [m for m in model.modules() if getattr(m, "sliding_window", None) is not None]
    if windowed:  # a window is a mask over global positions, which the chunks do not build
        raise ValueError("context parallel attention does not implement sliding windows")
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        return 0
    cp = ContextParallel(group, dist.get_rank(group), dist.get_world_size(group))
    for layer in layers:
        layer.context_parallel = cp
    return len(layers)
