"""Process group and device mesh: who this rank is and which ranks share its data.

`init_distributed` joins the torchrun group (nccl on CUDA, gloo on CPU) or, for a plain
`python -m trainer`, forms a one-process gloo group so the same code paths (DDP, FSDP2,
DCP) run everywhere. `build_mesh` lays ranks out as (pp, dp_replicate, dp_shard, cp, tp): tensor
parallel peers are adjacent ranks and share a data-parallel rank, so they see the same
batches. Expert parallelism (`ep_size`) spreads MoE experts over groups of adjacent
data-parallel (x context-parallel) ranks: ep_size divides dp_size x cp_size (no tp, no
dp_replicate), and the ranks holding the same experts shard them with FSDP2
(`trainer.parallelize`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.typed import Topology as Layout
from trainer.errors import TrainerError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Topology:
    """The mesh and this rank's place in data parallelism."""

    mesh: DeviceMesh
    dp_size: int
    dp_rank: int
    tp_size: int
    ep_size: int = 1
    pp_size: int = 1
    cp_size: int = 1

    @property
    def dp_mesh(self) -> DeviceMesh:
        names = self.mesh.mesh_dim_names or ()
        dims = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
        return self.mesh[dims] if len(dims) > 1 else self.mesh[dims[0]]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """What FSDP2 shards parameters and averages gradients over: the data-parallel axes,
        with dp_shard and cp flattened into one `dp_shard_cp` axis when cp > 1 (context
        peers hold the same parameters, and each computes the gradient of its own tokens)."""
        if self.cp_size == 1:
            return self.dp_mesh
        shard_cp = self.mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        if "dp_replicate" in (self.mesh.mesh_dim_names or ()):
            return self.mesh["dp_replicate", "dp_shard_cp"]
        return shard_cp

    @property
    def tp_mesh(self) -> DeviceMesh | None:
        return self.mesh["tp"] if self.tp_size > 1 else None

    @property
    def pp_mesh(self) -> DeviceMesh | None:
        return self.mesh["pp"] if self.pp_size > 1 else None

    @property
    def cp_mesh(self) -> DeviceMesh | None:
        return self.mesh["cp"] if self.cp_size > 1 else None

    @property
    def pp_rank(self) -> int:
        return self.mesh.get_local_rank("pp") if self.pp_size > 1 else 0

    @property
    def cp_rank(self) -> int:
        return self.mesh.get_local_rank("cp") if self.cp_size > 1 else 0

    def mesh_shape(self) -> dict[str, int]:
        """Axis name -> size of the mesh this rank built (what the `started` event reports)."""
        names = self.mesh.mesh_dim_names or ()
        return {name: int(size) for name, size in zip(names, self.mesh.shape, strict=True)}


def resources_from_env() -> dict[str, Any]:
    """What validation needs to know about this launch, from torchrun's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return {
        "nnodes": max(1, world // max(1, local)),
        "nproc_per_node": local,
        "accelerator": "cuda" if torch.cuda.is_available() else "cpu",
    }


def init_distributed(timeout_s: int = 600) -> DistEnv:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        else:  # a plain `python -m trainer`: one rank, no rendezvous needed
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    return DistEnv(
        dist.get_rank(),
        world,
        local_rank,
        int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
        device,
    )


def check_launch(env: DistEnv, layout: Layout) -> None:
    """The launch must be the one the recipe was validated for: world size and device kind.

    Not a recipe rule: validation checked the recipe against the job's resources; this
    catches a worker that started torchrun differently (or on a machine without the GPU).
    """
    device = "cuda" if env.device.type == "cuda" else "cpu"
    if env.world_size != layout.world_size or device != layout.accelerator:
        raise TrainerError(
            ExitCode.CRASH,
            f"launched as {env.world_size} {device} ranks, but the recipe was validated for "
            f"{layout.world_size} {layout.accelerator} ranks; start torchrun with the job's "
            "resources",
        )


def build_mesh(env: DistEnv, layout: Layout) -> Topology:
    """The ([pp,] [dp_replicate,] dp_shard, [cp,] tp) mesh of the validated layout.

    Axes of size 1 other than dp_shard and tp are left out. Pipeline stages are the
    outermost axis (stage peers are furthest apart: only activations cross it), tensor
    parallel peers the innermost (adjacent ranks), and context-parallel peers sit between
    them and data parallelism: they share a data-parallel rank, so they see the same batch
    and each keeps its own slice of the sequence.
    """
    tp, replicate, shard = layout.tp_size, layout.dp_replicate_size, layout.dp_shard_size
    pp, cp = layout.pp_size, layout.cp_size
    axes = [
        *([("pp", pp)] if pp > 1 else []),
        *([("dp_replicate", replicate)] if replicate > 1 else []),
        ("dp_shard", shard),
        *([("cp", cp)] if cp > 1 else []),
        ("tp", tp),
    ]
    mesh = init_device_mesh(
        env.device.type,
        tuple(size for _, size in axes),
        mesh_dim_names=tuple(name for name, _ in axes),
    )
    replica = mesh.get_local_rank("dp_replicate") if replicate > 1 else 0
    dp_rank = replica * shard + mesh.get_local_rank("dp_shard")
    return Topology(mesh, replicate * shard, dp_rank, tp, layout.ep_size, pp, cp)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few floats over all ranks (float64, so token counts stay exact)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor.tolist()


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
