"""One consolidated Hugging Face checkpoint from a pipeline-parallel model.

Under pipeline parallelism each pp rank holds only its stages' parameters (under their
full-model names). `save_pipeline_model` writes them all into one directory that
`transformers` loads as is: every stage plans its own safetensors shards, the plans are
shared over all ranks so the files get one global numbering (stage 0's first), each
stage's ranks gather their DTensors one at a time exactly as `consolidate` does (every
rank of a stage joins each `full_tensor`; an expert-parallel stage's grouped experts come
back whole from its ranks and are written per expert under the Hugging Face names by the
family's adapter), and one rank per stage writes that stage's files. Rank 0 then writes `model.safetensors.index.json` over all of them, `config.json`
and `generation_config.json`. No rank holds more than one full tensor at a time, and no
weights cross stage boundaries. A LoRA run's adapter (`save_pipeline_adapter`) is small:
each stage's writer sends its adapter tensors to rank 0, which writes one PEFT adapter;
its frozen base (a model built from a config) is saved stage by stage as above.
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
    Rename,
    _hf_layout,
    _lora_base_name,
    _unique_state,
    _write_config,
    gather_adapter_tensors,
    peft_adapter_state,
    write_lora_adapter,
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
    rename: Rename | None = None,
) -> None:
    """Write this rank's stages of `model` into the shared consolidated directory.

    Every rank calls; one rank per stage writes (`is_stage_writer`). `rename` maps each
    name to the one written, or to None to leave the tensor out (a LoRA model's base).
    """
    pp_rank, writes = topology.pp_rank, is_stage_writer(topology)
    items = _unique_state(model, rename)
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


def save_pipeline_lora_base(
    peft_model: nn.Module, out_dir: Path, topology: Topology, is_rank0: bool
) -> None:
    """The frozen base under a pipeline-split PEFT model, as one Hugging Face directory."""
    base = peft_model.get_base_model()
    save_pipeline_model(base, out_dir, topology, is_rank0, rename=_lora_base_name)


def save_pipeline_adapter(
    peft_model: nn.Module,
    out_dir: Path,
    topology: Topology,
    is_rank0: bool,
    base_model: str | None = None,
) -> None:
    """One PEFT adapter from every stage's adapters: each stage's writer gathers its own
    (small) tensors under PEFT's names and sends them to rank 0, which writes the adapter
    directory."""
    writes = is_stage_writer(topology)
    mine = gather_adapter_tensors(peft_model, keep=writes)
    state = peft_adapter_state(peft_model, mine) if writes else None
    every: list[Any] = [None] * dist.get_world_size() if is_rank0 else []
    dist.gather_object(state, every if is_rank0 else None, dst=0)
    if is_rank0:
        merged = {name: t for part in every if part for name, t in part.items()}
        write_lora_adapter(peft_model, merged, out_dir, base_model)
    barrier()
