"""Context parallelism for the native attention: all-gather K/V, attend causally, reduce-scatter.

Each of the `size` ranks of a context-parallel group holds a load-balanced slice of every
sequence: the sequence is cut into `2 * size` equal chunks and rank r keeps chunks r and
`2 * size - 1 - r`, so every rank attends over the same number of (query, key) pairs under
the causal mask. `sequence_indices` says which positions those are; the trainer shards
input ids, labels and position ids with it, so RoPE rotates each local token by its own
position (global, or document-local in packed rows). In attention, `_GatherSequence`
all-gathers the local K and V into the whole sequence in global order; its backward sums
every rank's dK/dV and hands each rank the part for its own tokens (a reduce-scatter).
Each local chunk then attends to the key prefix up to its own end with a causal mask
shifted by the chunk's global offset. Packed rows (position ids restarting at 0) also mask
keys of other documents: a pre-hook on the decoder stack all-gathers each forward's
position ids, from which `ContextParallel.observe` numbers the documents of the whole row.

Only torch.distributed collectives are used (all_gather, reduce_scatter_tensor), so this
runs on gloo (CPU) as well as NCCL (CUDA). Padding masks are not taken: attention is
causal over whole rows, which is exact for right-padded rows (a real token never attends
to a later pad), so the trainer drops the mask of its right-padded batches.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from models.common.layers import Attention, DecoderModel, _repeat_kv


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


@dataclass(eq=False)
class ContextParallel:
    """One rank's place in a context-parallel group, and the attention it computes there.

    `documents` holds the current rows' global document ids (batch, seq) when they are
    packed (position ids restarting at 0), None for one document per row; `observe` sets
    it from each forward's position ids.
    """

    group: Any
    rank: int
    size: int
    documents: torch.Tensor | None = None

    def gather(self, local: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """The whole sequence from every rank's slice (differentiable across ranks)."""
        return _GatherSequence.apply(local, self.group, self.size, dim)

    def observe(self, position_ids: torch.Tensor | None) -> None:
        """Learn the rows' documents from this forward's local position ids (all ranks')."""
        if position_ids is None:
            raise ValueError(
                "context parallel forward needs position_ids: the global positions of the "
                "local tokens (or their document-local positions in packed rows)"
            )
        parts = [torch.empty_like(position_ids) for _ in range(self.size)]
        dist.all_gather(parts, position_ids.contiguous(), group=self.group)
        whole = _to_global_order(parts, dim=1)
        restarts = bool((whole[:, 1:] == 0).any()) and bool((whole[:, 0] == 0).all())
        self.documents = (whole == 0).cumsum(dim=1) if restarts else None

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dropout_p: float
    ) -> torch.Tensor:
        """Causal attention of the local queries over the whole sequence's keys (within
        each query's document for packed rows).

        q, k, v: (batch, heads, local_seq, head_dim), the local slice of two chunks each;
        k and v may have fewer heads (grouped-query attention). Returns q's shape.
        """
        # one collective for both (and one reduce-scatter for dK and dV in backward)
        k_all, v_all = self.gather(torch.cat([k, v], dim=1)).split(k.shape[1], dim=1)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # masked attention with grouped heads falls back to math kernels
            k_all, v_all = _repeat_kv(k_all, groups), _repeat_kv(v_all, groups)
        chunk = q.shape[2] // 2
        outputs = []
        for half, index in enumerate((self.rank, 2 * self.size - 1 - self.rank)):
            end = (index + 1) * chunk  # keys past the chunk's end are all in the future
            mask = self._chunk_mask(index, chunk, q.device)
            outputs.append(
                F.scaled_dot_product_attention(
                    q[:, :, half * chunk : (half + 1) * chunk],
                    k_all[:, :, :end],
                    v_all[:, :, :end],
                    attn_mask=mask,
                    is_causal=mask is None,
                    dropout_p=dropout_p,
                    scale=scale,
                )
            )
        return torch.cat(outputs, dim=2)

    def _chunk_mask(self, index: int, chunk: int, device: Any) -> torch.Tensor | None:
        """Chunk `index`'s queries over keys [0, its end): causal at the chunk's global
        offset, and within the query's document; None when plain causal is exact."""
        if index == 0 and self.documents is None:
            return None
        end = (index + 1) * chunk
        mask = torch.ones(chunk, end, dtype=torch.bool, device=device).tril(diagonal=index * chunk)
        if self.documents is None:
            return mask
        docs = self.documents.to(device)
        same = docs[:, index * chunk : end, None] == docs[:, None, :end]
        return (mask & same)[:, None]


def enable_context_parallel(model: nn.Module, group: Any) -> int:
    """Make every native attention layer of `model` attend context-parallel over `group`.

    Each decoder stack (`DecoderModel`) gets a forward pre-hook that hands its position
    ids to `ContextParallel.observe`. Returns how many attention layers it set (0: the
    model has no native attention, e.g. a Hugging Face fallback class, and cannot run
    context parallel). Raises ValueError for layers with a sliding window, and for native
    attention outside a `DecoderModel` (nothing would pass it the rows' documents).
    """
    windowed = [m for m in model.modules() if getattr(m, "sliding_window", None) is not None]
    if windowed:  # a window is a mask over global positions, which the chunks do not build
        raise ValueError("context parallel attention does not implement sliding windows")
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        return 0
    stacks = [m for m in model.modules() if isinstance(m, DecoderModel)]
    if not stacks:
        raise ValueError("context parallel attention runs in the common decoder stack only")
    cp = ContextParallel(group, dist.get_rank(group), dist.get_world_size(group))
    for layer in layers:
        layer.context_parallel = cp
    for stack in stacks:
        stack.register_forward_pre_hook(_observer(cp), with_kwargs=True)
    return len(layers)


def _observer(cp: ContextParallel) -> Any:
    def observe_positions(module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        cp.observe(bound.arguments.get("position_ids"))

    return observe_positions
