"""MetricsSample records, lifecycle events, memory and the peak FLOP/s behind MFU.

Rank 0 appends one JSON line per record to `D/metrics.jsonl` and per lifecycle event to
`D/events.jsonl`, flushing each line before training goes on, so a crash loses at most
the step in flight. Record shapes are the contract the worker ingests (see the brief).
`RunLog` also hands every record to the recipe's experiment trackers (`trainer.trackers`).
MFU divides model FLOPs (`models.hooks.model_flops_per_token`) by the devices' peak:
a table of dense bf16 peaks for GPUs, or on CPU a float32 matmul rate measured once.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil
import torch

from jobs.recipe.typed import Recipe
from models.hooks import model_flops_per_token
from trainer.trackers import FAILED, FINISHED, KILLED, GuardedTracker, open_trackers

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, matched against the device name.
GPU_PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


@dataclass
class TrainRecord:
    step: int
    epoch: int
    loss: float
    grad_norm: float
    lr: float
    mem: float
    tps: float
    tps_per_rank: float
    mfu: float
    num_tokens: int
    timestamp: float
    kind: str = "train"


@dataclass
class ValRecord:
    step: int
    epoch: int
    val_loss: float
    num_tokens: int
    timestamp: float
    kind: str = "val"


class JsonlWriter:
    """Appends JSON lines, flushed one by one; a no-op on ranks other than 0."""

    def __init__(self, path: Path, enabled: bool):
        self._file: TextIO | None = None
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# The event that settles how a run ends, as the trackers are told at close.
OUTCOME_EVENTS = {"failed": FAILED, "preempted": KILLED}


class RunLog:
    """The run dir's two logs, `metrics.jsonl` (MetricsSample) and `events.jsonl`, and the
    recipe's experiment trackers, which see every record `metrics.jsonl` gets (rank 0)."""

    def __init__(self, run_dir: Path, is_rank0: bool):
        self.run_dir, self.is_rank0 = run_dir, is_rank0
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl", is_rank0)
        self.events = JsonlWriter(run_dir / "events.jsonl", is_rank0)
        self.trackers: list[GuardedTracker] = []
        self.outcome, self.step = FINISHED, 0

    def open_trackers(self, recipe: Recipe) -> None:
        """Start the recipe's `wandb:` / `mlflow:` trackers; only rank 0 has any."""
        if self.is_rank0 and not self.trackers:
            self.trackers = open_trackers(recipe, self.run_dir, self._tracker_warning)

    def _tracker_warning(self, tracker: str, message: str) -> None:
        self.event("tracker_warning", self.step, tracker=tracker, message=message)

    def record(self, sample: TrainRecord | ValRecord) -> None:
        data = asdict(sample)
        self.metrics.write(data)
        self.step = sample.step
        for tracker in self.trackers:
            if sample.kind == "val":
                tracker.log_val(data)
            else:
                tracker.log_train(data)

    def event(self, name: str, step: int, **fields: Any) -> None:
        self.outcome = OUTCOME_EVENTS.get(name, self.outcome)
        self.events.write({"event": name, "step": step, "timestamp": time.time(), **fields})

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish(self.outcome)
        self.metrics.close()
        self.events.close()


def memory_gib(device: torch.device) -> float:
    """Peak allocated GiB on a CUDA device, else the process's resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return psutil.Process().memory_info().rss / 2**30


def measure_cpu_matmul_flops(size: int = 256, seconds: float = 0.2) -> float:
    """Float32 matmul FLOP/s of this process (one rank's peak on CPU)."""
    generator = torch.Generator().manual_seed(0)  # never touch the training RNG stream
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    torch.mm(a, b)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        runs += 1
    return 2 * size**3 * runs / (time.perf_counter() - start)


def device_peak_flops(device: torch.device) -> float:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAK_FLOPS:
            if key in name:
                return peak
        return 312e12  # an unknown GPU: assume A100 class rather than report nothing
    return measure_cpu_matmul_flops()


class StepMeter:
    """Turns one step's loss, tokens and wall time into a TrainRecord (tps, mem, MFU)."""

    def __init__(self, model: Any, device: torch.device, world_size: int):
        self.config = getattr(model, "config", None)
        self.device, self.world_size = device, world_size
        self.peak = device_peak_flops(device) * world_size

    def train_record(
        self,
        step: int,
        epoch: int,
        loss: float,
        grad_norm: float,
        lr: float,
        tokens: int,
        seq_len: int,
        start: float,
    ) -> TrainRecord:
        tps = tokens / max(time.perf_counter() - start, 1e-9)
        flops = model_flops_per_token(self.config, seq_len) if self.config is not None else 0.0
        return TrainRecord(
            step,
            epoch,
            loss,
            grad_norm,
            lr,
            memory_gib(self.device),
            tps,
            tps / self.world_size,
            flops * tps / self.peak,
            tokens,
            time.time(),
        )
