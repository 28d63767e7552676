"""Timing and identity settings of the worker and the reconciler (`TUNEYARD_WORKER_*`).

Production defaults are minutes-scale leases polled every second; tests shrink them
through the environment so a lost worker is noticed in seconds.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNEYARD_WORKER_", extra="ignore")

    name: str = ""
    queues: str = "cpu"
    lease_seconds: float = 60.0  # a job whose lease is older is taken over as a new attempt
    poll_seconds: float = 1.0  # status check, lease renewal, cancel/pause polling
    ingest_seconds: float = 0.25  # how often metrics/events files are tailed
    heartbeat_seconds: float = 5.0
    stale_worker_seconds: float = 30.0  # a worker silent this long is marked lost
    stop_grace_seconds: float = 10.0  # SIGTERM -> SIGKILL on cancel/pause
    gang_wait_seconds: float = 300.0  # how long a multi-node job waits for its nodes
    redispatch_grace_seconds: float = 30.0  # queued this long without a claim -> re-send
    reconcile_seconds: float = 5.0
    rendezvous_host: str = ""  # address other nodes reach this one at; default hostname
    cpu_ranks: int = 0  # CPU ranks this worker offers; 0 = os.cpu_count()
    trainer_module: str = "trainer"  # what torchrun runs with -m (tests may swap it)

    def worker_name(self) -> str:
        return self.name or f"{socket.gethostname()}-{os.getpid()}"

    def queue_list(self) -> list[str]:
        return [q.strip() for q in self.queues.split(",") if q.strip()]

    def host_address(self) -> str:
        return self.rendezvous_host or socket.gethostname()


@lru_cache(maxsize=1)
def get_worker_config() -> WorkerConfig:
    return WorkerConfig()
