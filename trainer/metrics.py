"""MetricsSample records, lifecycle events, memory and the peak FLOP/s behind MFU.

Rank 0 appends one JSON line per record to `D/metrics.jsonl` and per lifecycle event to
`D/events.jsonl`, flushing each line before training goes on, so a crash loses at most
the step in flight. Record shapes are the contract the worker ingests (see the brief).
`RunLog` also hands every record to the recipe's experiment trackers (`trainer.trackers`).
MFU divides model FLOPs (`models.hooks.model_flops_per_token`, from the architecture) by the
devices' peak from a table by device name and compute dtype, and is null where the peak is
unknown (CPU included). Memory is each rank's peak: CUDA `max_memory_allocated`, on CPU the
growth of the peak resident set over the set when the run log opened (`peak_memory_bytes`).
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import psutil
import torch
import torch.distributed as dist

from jobs.recipe.typed import Recipe
from models.hooks import model_flops_per_token
from trainer.console import Console
from trainer.trackers import FAILED, FINISHED, KILLED, GuardedTracker, open_trackers

if TYPE_CHECKING:
    from trainer.checkpoint.manager import PublishedSave


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
    mfu: float | None
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
        mark_memory_baseline()  # opened before the model is built: the run's memory starts here
        self.run_dir, self.is_rank0 = run_dir, is_rank0
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl", is_rank0)
        self.events = JsonlWriter(run_dir / "events.jsonl", is_rank0)
        self.console = Console(is_rank0)  # the job log's readable lines
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
        self.console.record(data)
        self.step = sample.step
        for tracker in self.trackers:
            if sample.kind == "val":
                tracker.log_val(data)
            else:
                tracker.log_train(data)

    def event(self, name: str, step: int, **fields: Any) -> None:
        self.outcome = OUTCOME_EVENTS.get(name, self.outcome)
        self.events.write({"event": name, "step": step, "timestamp": time.time(), **fields})
        self.console.event(name, step, fields)

    def checkpoints_saved(self, saves: list[PublishedSave]) -> None:
        """One `checkpoint_saved` event per published checkpoint, then one `checkpoint_deleted`
        per checkpoint retention removed once it was published (rank 0 gets them)."""
        for save in saves:
            fields = {
                "path": str(save.path),
                "size_bytes": save.size_bytes,
                "metrics": save.metrics,
            }
            self.event("checkpoint_saved", save.step, **fields)
            for gone in save.deleted:  # retention (`trainer.checkpoint.retention`)
                self.event("checkpoint_deleted", gone.step, path=str(gone.path), reason=gone.reason)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish(self.outcome)
        self.metrics.close()
        self.events.close()


def _rss_bytes() -> int:
    return psutil.Process().memory_info().rss


# The resident set the CPU peak is measured from: at import, then again when the run log
# opens (`RunLog`: the trainer's modules imported, the process group up, nothing built), so
# the growth is what the run itself holds, not the interpreter and its libraries. `peak` is
# the highest growth read since: Linux's `VmHWM` is the larger of the high-water mark the
# kernel last recorded and the current set, and the kernel updates that mark on only some of
# the paths that release pages, so a reading can fall below an earlier one.
_cpu_memory = {"baseline": _rss_bytes(), "peak": 0}


def mark_memory_baseline() -> None:
    _cpu_memory["baseline"], _cpu_memory["peak"] = _rss_bytes(), 0


def _peak_rss_bytes() -> int:
    """This process's resident high-water mark. Linux's `VmHWM` belongs to the process's own
    address space; `ru_maxrss` survives fork and exec, so a trainer started by a large
    parent (a test runner, a worker) would report the parent's peak as its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def peak_memory_bytes(device: torch.device) -> int:
    """This rank's peak memory so far: CUDA `max_memory_allocated`, else the growth of the
    process's peak resident set over the baseline, never below an earlier reading."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    growth = _peak_rss_bytes() - _cpu_memory["baseline"]
    _cpu_memory["peak"] = max(_cpu_memory["peak"], growth)
    return _cpu_memory["peak"]


def memory_gib(device: torch.device) -> float:
    """`peak_memory_bytes` in GiB (MetricsSample `mem`)."""
    return peak_memory_bytes(device) / 2**30


def rank_peak_memory(device: torch.device) -> list[int]:
    """Every rank's `peak_memory_bytes`, in rank order (a collective: all ranks call it)."""
    mine = peak_memory_bytes(device)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [int(value) for value in gathered]


# Dense (no sparsity) peaks in FLOP/s by device name and compute dtype; float32 is the
# plain (non-TF32) rate, which torch uses for float32 matmuls by default. The first name
# contained in the device's name wins, so "H100 PCIe" comes before "H100".
PEAK_FLOPS_BY_DTYPE: tuple[tuple[str, dict[str, float]], ...] = (
    ("GH200", {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}),
    ("H100 PCIe", {"bfloat16": 756e12, "float16": 756e12, "float32": 51e12}),
    ("H200", {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}),
    ("H100", {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}),
    ("H800", {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12}),
    ("B200", {"bfloat16": 2250e12, "float16": 2250e12, "float32": 80e12}),
    ("B100", {"bfloat16": 1750e12, "float16": 1750e12, "float32": 60e12}),
    ("A100", {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12}),
    ("A800", {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12}),
    ("L40S", {"bfloat16": 362e12, "float16": 362e12, "float32": 91.6e12}),
    ("L4", {"bfloat16": 121e12, "float16": 121e12, "float32": 30.3e12}),
    ("A10", {"bfloat16": 125e12, "float16": 125e12, "float32": 31.2e12}),
    ("V100", {"float16": 125e12, "float32": 15.7e12}),
    ("T4", {"float16": 65e12, "float32": 8.1e12}),
)
# The bfloat16 column, as the benchmark recipe reads it.
GPU_PEAK_FLOPS = tuple(
    (name, peaks["bfloat16"]) for name, peaks in PEAK_FLOPS_BY_DTYPE if "bfloat16" in peaks
)


def peak_flops_for(device_name: str, dtype: str) -> float | None:
    """The table's peak for this device and compute dtype; None when either is unknown."""
    for key, peaks in PEAK_FLOPS_BY_DTYPE:
        if key in device_name:
            return peaks.get(dtype)
    return None


def device_peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """One device's peak for `dtype`; None on CPU and on accelerators the table lacks (an
    MFU against a guessed peak would say nothing)."""
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device), str(dtype).removeprefix("torch."))


def compute_dtype(model: Any) -> torch.dtype:
    """The dtype matmuls run in: FSDP2's mixed-precision param dtype, else the parameters'."""
    state = getattr(model, "_get_fsdp_state", None)
    policy = getattr(state(), "_mp_policy", None) if callable(state) else None
    if policy is not None and policy.param_dtype is not None:
        return policy.param_dtype
    first = next(iter(model.parameters()), None)
    return first.dtype if first is not None else torch.float32


def lora_adapter_params(model: Any) -> int | None:
    """Trainable LoRA adapter parameters, or None for a model without adapters."""
    sizes = [p.numel() for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
    return sum(sizes) if sizes else None


class StepMeter:
    """Turns one step's loss, tokens and wall time into a TrainRecord (tps, mem, MFU).

    FLOPs per token come from the architecture (`models.hooks.model_flops_per_token`; with
    LoRA adapters the frozen base costs forward + input gradient); MFU is null where the
    device's peak for the compute dtype is unknown, CPU included. A metric never stops a
    run: a config the FLOP counter cannot read (per-layer sizes it does not know) leaves MFU
    null for the run, reported once through `warn`.
    """

    def __init__(
        self,
        model: Any,
        device: torch.device,
        world_size: int,
        warn: Callable[[str], None] | None = None,
    ):
        self.config = getattr(model, "config", None)
        self.device, self.world_size = device, world_size
        self.adapters = lora_adapter_params(model)
        self.warn = warn
        peak = device_peak_flops(device, compute_dtype(model))
        self.peak = peak * world_size if peak is not None else None

    def flops_per_token(self, seq_len: int) -> float | None:
        if self.config is None:
            return None
        try:
            return model_flops_per_token(self.config, seq_len, lora=self.adapters)
        except Exception as exc:  # noqa: BLE001 - training goes on without the figure
            self.config = None  # not counted again: mfu stays null for this run
            if self.warn is not None:
                self.warn(
                    f"FLOPs per token could not be counted for this model's config "
                    f"({type(exc).__name__}: {str(exc)[:300]}); mfu is null for this run"
                )
            return None

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
        flops = self.flops_per_token(seq_len)
        mfu = flops * tps / self.peak if flops is not None and self.peak else None
        return TrainRecord(
            step,
            epoch,
            loss,
            grad_norm,
            lr,
            memory_gib(self.device),
            tps,
            tps / self.world_size,
            mfu,
            tokens,
            time.time(),
        )
