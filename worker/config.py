"""Timing and identity settings of the worker and the reconciler (`TUNEYARD_WORKER_*`).

Production defaults are minutes-scale leases polled every second; tests shrink them
through the environment so a lost worker is noticed in seconds.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNEYARD_WORKER_", extra="ignore", populate_by_name=True
    )

    name: str = ""
    queues: str = "cpu"
    lease_seconds: float = 60.0  # a job whose lease is older is taken over as a new attempt
    poll_seconds: float = 1.0  # status check, lease renewal, cancel/pause polling
    ingest_seconds: float = 0.25  # how often metrics/events files are tailed
    heartbeat_seconds: float = 5.0
    stale_worker_seconds: float = 30.0  # a worker silent this long is marked lost
    stop_grace_seconds: float = 10.0  # SIGTERM -> SIGKILL on cancel/pause
    gang_wait_seconds: float = 300.0  # how long a multi-node job waits for its nodes
    # How long a launch the scheduler cannot take for now (SLURM's controller restarting)
    # is asked again, with backoff, before the attempt fails.
    launch_retry_seconds: float = 300.0
    redispatch_grace_seconds: float = 30.0  # queued this long without a claim -> re-send
    reconcile_seconds: float = 5.0
    retention_seconds: float = 300.0  # how often the scheduler applies retention policies
    # With an artifact store: hours after its job finished that a stored checkpoint's local
    # copy stays as a cache before the scheduler evicts it (0: as soon as it is stored).
    checkpoint_cache_hours: float = Field(24.0, ge=0)
    rendezvous_host: str = ""  # address other nodes reach this one at; default hostname
    cpu_ranks: int = 0  # CPU ranks this worker offers; 0 = os.cpu_count()
    gpu_wait_seconds: float = 30.0  # a CUDA job waits this long for its GPU slice, then re-queues
    trainer_module: str = "trainer"  # what torchrun runs with -m (tests may swap it)
    # Where attempts run: `local` (torchrun as a child) or `slurm` (sbatch from a submit
    # node). Read from TUNEYARD_EXECUTOR, or TUNEYARD_WORKER_EXECUTOR.
    executor: Literal["local", "slurm"] = Field(
        "local", validation_alias=AliasChoices("TUNEYARD_EXECUTOR", "TUNEYARD_WORKER_EXECUTOR")
    )
    slurm_partition: str = ""  # empty: the cluster's default partition
    slurm_account: str = ""
    slurm_qos: str = ""
    slurm_time_limit: str = ""  # SLURM's format (minutes, HH:MM:SS, D-HH); empty: the partition's
    slurm_mem: str = ""  # --mem per node (e.g. 200G); empty: the cluster default
    slurm_cpus_per_gpu: int = 8  # CPUs per GPU rank for CUDA jobs (CPU jobs: one per rank)
    slurm_signal_seconds: int = 120  # SIGTERM this long before the time limit
    slurm_poll_seconds: float = 1.0  # how often `scontrol show job` is asked
    slurm_extra_args: str = ""  # more #SBATCH options, shell-quoted (e.g. "--constraint=h100")

    def worker_name(self) -> str:
        return self.name or f"{socket.gethostname()}-{os.getpid()}"

    def queue_list(self) -> list[str]:
        return [q.strip() for q in self.queues.split(",") if q.strip()]

    def host_address(self) -> str:
        return self.rendezvous_host or socket.gethostname()


@lru_cache(maxsize=1)
def get_worker_config() -> WorkerConfig:
    return WorkerConfig()
