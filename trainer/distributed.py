"""Process group and device mesh: who this rank is and which ranks share its data.

`init_distributed` joins the torchrun group (nccl on CUDA, gloo on CPU) or, for a plain
`python -m trainer`, forms a one-process gloo group so the same code paths (DDP, FSDP2,
DCP) run everywhere. `build_mesh` lays ranks out as (dp_replicate, dp_shard, tp): tensor
parallel peers are adjacent ranks and share a data-parallel rank, so they see the same
batches. Expert parallelism (`ep_size`) spreads MoE experts over the data-parallel ranks
themselves: it needs ep_size == the data-parallel size (no tp, no dp_replicate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.errors import unsupported


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

    @property
    def dp_mesh(self) -> DeviceMesh:
        names = self.mesh.mesh_dim_names or ()
        dims = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
        return self.mesh[dims] if len(dims) > 1 else self.mesh[dims[0]]

    @property
    def tp_mesh(self) -> DeviceMesh | None:
        return self.mesh["tp"] if self.tp_size > 1 else None


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


def check_backend(env: DistEnv, dist_env: dict[str, Any] | None) -> None:
    """`dist_env.backend` must name the backend this machine uses (nccl on CUDA, else gloo)."""
    requested = (dist_env or {}).get("backend")
    actual = "nccl" if env.device.type == "cuda" else "gloo"
    if requested and requested != actual:
        raise unsupported(
            f"dist_env.backend: {requested} cannot run on {env.device.type}; "
            f"set dist_env.backend: {actual} or remove it"
        )


def build_mesh(env: DistEnv, distributed: dict[str, Any]) -> Topology:
    """A ([dp_replicate,] dp_shard, tp) mesh from the normalized `distributed` section."""
    for axis in ("pp_size", "cp_size"):
        if int(distributed.get(axis) or 1) > 1:
            raise unsupported(
                f"distributed.{axis} > 1 is not supported by this trainer yet; "
                f"set distributed.{axis}: 1"
            )
    tp = int(distributed.get("tp_size") or 1)
    replicate = int(distributed.get("dp_replicate_size") or 1)
    if env.world_size % (tp * replicate):
        raise unsupported(
            f"world size {env.world_size} is not divisible by tp_size {tp} x "
            f"dp_replicate_size {replicate}"
        )
    shard = env.world_size // (tp * replicate)
    axes = ([("dp_replicate", replicate)] if replicate > 1 else []) + [
        ("dp_shard", shard),
        ("tp", tp),
    ]
    mesh = init_device_mesh(
        env.device.type,
        tuple(size for _, size in axes),
        mesh_dim_names=tuple(name for name, _ in axes),
    )
    replica = mesh.get_local_rank("dp_replicate") if replicate > 1 else 0
    dp_rank = replica * shard + mesh.get_local_rank("dp_shard")
    ep = _expert_parallel_size(distributed, replicate * shard, tp, replicate)
    return Topology(mesh, replicate * shard, dp_rank, tp, ep)


def _expert_parallel_size(distributed: dict[str, Any], dp: int, tp: int, replicate: int) -> int:
    """`ep_size`, which this trainer lays over all data-parallel ranks (one ep group)."""
    ep = int(distributed.get("ep_size") or 1)
    if ep > 1 and (tp > 1 or replicate > 1 or ep != dp):
        raise unsupported(
            f"distributed.ep_size {ep}: this trainer spreads experts over all data-parallel "
            f"ranks, so ep_size must equal the data-parallel size ({dp}) with tp_size 1 and "
            f"dp_replicate_size 1; set distributed.ep_size: {dp if tp == replicate == 1 else 1}"
        )
    return ep


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
