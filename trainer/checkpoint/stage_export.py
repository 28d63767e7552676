"""One consolidated Hugging Face checkpoint from a pipeline-parallel model.

Under pipeline parallelism each pp rank holds only its stages' parameters (under their
full-model names). `save_pipeline_model` writes them all into one directory that
`transformers` loads as is: every stage plans its own safetensors shards, the plans are
shared over all ranks so the files get one global numbering (stage 0's first), each
stage's ranks gather their DTensors one at a time exactly as `consolidate` does (every
rank of a stage joins each `full_tensor`), and one rank per stage writes that stage's
files. Rank 0 then writes `model.safetensors.index.json` over all of them, `config.json`
and `generation_config.json`. No rank holds more than one full tensor at a time, and no
weights cross stage boundaries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from models.common.safetensors_io import (
    TensorEntry,
    plan_shards,
    shard_file_names,
    write_index,
)
from trainer.checkpoint.consolidate import (
    DEFAULT_MAX_SHARD_BYTES,
    _hf_layout,
    _unique_state,
    _write_config,
    write_shard_files,
)
from trainer.distributed import Topology, barrier


def _all_plans(
    pp_rank: int, writes: bool, shards: list[list[TensorEntry]]
) -> list[list[list[TensorEntry]]]:
    """Every stage's shard plan, by pp rank (one writer per stage contributes it)."""
    mine = (pp_rank, shards if writes else None)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    plans: dict[int, list[list[TensorEntry]]] = {}
    for rank, plan in gathered:
        if plan is not None:
            plans[rank] = plan
    return [plans[rank] for rank in sorted(plans)]


def is_stage_writer(topology: Topology) -> bool:
    """The one rank of each stage's ranks (dp rank 0, tp rank 0) that writes its files."""
    tp_rank = topology.mesh.get_local_rank("tp") if topology.tp_size > 1 else 0
    return topology.dp_rank == 0 and tp_rank == 0


def save_pipeline_model(
    model: nn.Module,
    out_dir: Path,
    topology: Topology,
    is_rank0: bool,
    generation_config: Any = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> None:
    """Write this rank's stages of `model` into the shared consolidated directory.

    Every rank calls; one rank per stage writes (`is_stage_writer`).
    """
    pp_rank, writes = topology.pp_rank, is_stage_writer(topology)
    items = _unique_state(model)
    entries, source = _hf_layout(model, items)
    shards = plan_shards(entries, max_shard_bytes) if entries else []
    plans = _all_plans(pp_rank, writes, shards)
    all_shards = [shard for plan in plans for shard in plan]
    names = shard_file_names(len(all_shards))
    first = sum(len(plan) for plan in plans[:pp_rank])
    if is_rank0 or writes:
        out_dir.mkdir(parents=True, exist_ok=True)
    files = names[first : first + len(shards)]
    write_shard_files(model, out_dir, dict(items), source, zip(files, shards, strict=True), writes)
    if is_rank0:
        write_index(out_dir, all_shards)
        every_entry = [entry for shard in all_shards for entry in shard]
        _write_config(model, out_dir, every_entry, generation_config)
    barrier()
