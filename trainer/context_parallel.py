"""Context parallelism in the trainer: the model's attention hook and the batch's slices.

Context-parallel peers share a data-parallel rank, so they load the same batch; each keeps
a load-balanced slice of every row (`models.common.context_parallel.sequence_indices`:
chunks r and 2*cp-1-r of 2*cp). `apply_context_parallel` sets the native attention
layers to all-gather K/V over the mesh's `cp` axis. `shard_batch` cuts input ids, labels
and position ids the same way: rows are first right-padded to a multiple of 2*cp with
ignored labels (a real token never attends to a later pad under the causal mask, so the
loss is unchanged); position ids are the tokens' global positions, or in packed rows the
collator's document-local ones (the attention derives the documents from them); the
attention mask is dropped (the collator pads on the right only, which causal attention
already honours). The labels become this rank's share of the label tokens and cp rank 0
keeps `num_tokens`, so the step loop's sums over all ranks stay the whole batch's: the
loss is normalised by the same global label count as without CP.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common.context_parallel import enable_context_parallel, sequence_indices
from trainer.distributed import Topology
from trainer.errors import data_error

IGNORE = -100


def apply_context_parallel(model: nn.Module, topology: Topology) -> None:
    """Make the model's attention context-parallel over the `cp` mesh axis."""
    try:
        layers = enable_context_parallel(model, topology.cp_mesh.get_group())
    except ValueError as exc:
        layers, reason = 0, str(exc)
    else:
        reason = "it has no native attention layers (it loaded with the Hugging Face class)"
    if layers == 0:
        # the checkpoint's config decides the class and its layers: a data error
        raise data_error(
            f"model: context parallelism cannot run this model: {reason}; "
            "set distributed.cp_size: 1"
        )


def shard_batch(batch: dict[str, Any], topology: Topology) -> dict[str, Any]:
    """This cp rank's slice of a collated batch (the batch itself when cp_size is 1)."""
    size = topology.cp_size
    if size == 1:
        return batch
    ids, labels = batch["input_ids"], batch["labels"]
    rows, length = ids.shape
    positions = batch.get("position_ids")  # packed rows: document-local positions
    pad = -length % (2 * size)
    if pad:
        ids, labels = F.pad(ids, (0, pad)), F.pad(labels, (0, pad), value=IGNORE)
        positions = None if positions is None else F.pad(positions, (0, pad))
    if positions is None:  # one document per row: the tokens' global positions
        positions = torch.arange(length + pad, device=ids.device).expand(rows, -1)
    index = sequence_indices(length + pad, topology.cp_rank, size, device=ids.device)
    out = {k: v for k, v in batch.items() if k != "attention_mask"}
    out["input_ids"], out["labels"] = ids[:, index], labels[:, index]
    out["position_ids"] = positions[:, index]
    # the batch's token count once over the cp ranks, so the step's sums stay the batch's
    out["num_tokens"] = batch["num_tokens"] if topology.cp_rank == 0 else 0
    return out
