"""The benchmark loop (`recipe: llm_benchmark`): warm-up steps, measured steps, a summary.

Every step is the fine-tuning loop's `train_step` on the recipe's data (a mock dataset,
typically), timed between device synchronisations, and writes the same MetricsSample as
training (`tps`, `tps_per_rank`, and `mfu`: TFLOP/s per rank over the device's peak, null
where the peak is unknown: on CPU, or a GPU the peak table lacks, with no
`benchmark.peak_tflops`). FLOPs per token are counted as the training loop counts them
(`StepMeter`): a config the counter cannot read leaves TFLOP/s and MFU null with one
`metric_warning` event, and the benchmark goes on measuring throughput. The first
`warmup_steps` steps pay for allocation and kernel selection, so only the steps after them
are measured. At the end rank 0 writes one
`benchmark_summary` event: median and mean throughput, TFLOP/s per rank and MFU, step-time
statistics, and each measured step (TFLOP/s per rank has no MetricsSample column).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from jobs.recipe.exit_codes import ExitCode
from trainer.finetune import (
    Preemption,
    _layout,
    _stop_if_not_finite,
    batches,
    metric_warning,
    save_checkpoint,
    train_step,
    with_preemption,
)
from trainer.metrics import GPU_PEAK_FLOPS, RunLog, StepMeter, TrainRecord, memory_gib
from trainer.setup import TrainingRun


@dataclass(frozen=True)
class MeasuredStep:
    step: int
    step_time_s: float
    num_tokens: int
    tps: float
    tps_per_rank: float
    tflops_per_rank: float | None  # None when the config's FLOPs cannot be counted
    mfu: float | None


def device_peak_tflops(device: torch.device, configured: float | None) -> float | None:
    """One device's dense bf16 peak in TFLOP/s: the recipe's, the table's, else unknown."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak / 1e12 for key, peak in GPU_PEAK_FLOPS if key in name), None)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(run: TrainingRun, stream: Iterator) -> tuple[int, list[dict], float, tuple]:
    """One optimizer step between device synchronisations: (epoch, batches, seconds, result)."""
    _synchronize(run.env.device)
    start = time.perf_counter()
    micro = [next(stream) for _ in range(run.grad_accumulation_steps)]
    micro_batches = [batch for _, batch in micro]
    result = train_step(run, micro_batches)
    _synchronize(run.env.device)
    return micro[0][0], micro_batches, max(time.perf_counter() - start, 1e-9), result


def benchmark_step(
    run: TrainingRun, stream: Iterator, peak_tflops: float | None, meter: StepMeter
) -> tuple[TrainRecord, MeasuredStep]:
    """One timed step; `meter` counts its FLOPs per token as the training loop does (with
    LoRA adapters the frozen base costs forward + input gradient), None if it cannot."""
    lr = run.optimizer.param_groups[0]["lr"]
    epoch, micro_batches, seconds, (loss, grad_norm, tokens) = _timed_step(run, stream)
    run.step += 1
    tps = tokens / seconds
    tps_per_rank = tps / run.env.world_size
    flops = meter.flops_per_token(micro_batches[0]["input_ids"].shape[1])
    tflops = flops * tps_per_rank / 1e12 if flops is not None else None
    mfu = tflops / peak_tflops if tflops is not None and peak_tflops else None
    record = TrainRecord(
        run.step,
        epoch,
        loss,
        grad_norm,
        lr,
        memory_gib(run.env.device),
        tps,
        tps_per_rank,
        mfu,
        tokens,
        time.time(),
    )
    return record, MeasuredStep(run.step, seconds, tokens, tps, tps_per_rank, tflops, mfu)


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "mean": statistics.fmean(values)}


def _known_stats(values: list[float | None]) -> dict[str, float] | None:
    """Median and mean of the known values; None when no step has one."""
    known = [v for v in values if v is not None]
    return _stats(known) if known else None


def summarize(
    measured: list[MeasuredStep], warmup_steps: int, peak_tflops: float | None
) -> dict[str, Any]:
    """The `benchmark_summary` fields over the measured steps (warm-up excluded)."""
    times = [m.step_time_s for m in measured]
    return {
        "warmup_steps": warmup_steps,
        "measured_steps": len(measured),
        "first_measured_step": measured[0].step,
        "last_measured_step": measured[-1].step,
        "tokens_per_s": _stats([m.tps for m in measured]),
        "tokens_per_s_per_rank": _stats([m.tps_per_rank for m in measured]),
        "tflops_per_rank": _known_stats([m.tflops_per_rank for m in measured]),
        "peak_tflops_per_rank": peak_tflops,
        "mfu": _known_stats([m.mfu for m in measured]) if peak_tflops else None,
        "step_time_s": {
            **_stats(times),
            "min": min(times),
            "max": max(times),
            "stdev": statistics.pstdev(times),
        },
        "steps": [asdict(m) for m in measured],
    }


def run_benchmark(run: TrainingRun, log: RunLog) -> ExitCode:
    """Warm-up then measured steps up to `max_steps`; a summary event, then `finished`.
    SIGTERM ends it after the step in flight with `preempted` and no summary: a retry
    measures again from the start rather than joining two runs' timings."""
    log.open_trackers(run.recipe)
    return with_preemption(_benchmark_loop, run, log)


def _benchmark_loop(run: TrainingRun, log: RunLog, preemption: Preemption) -> ExitCode:
    bench = run.recipe.benchmark
    assert bench is not None, "validation gives every llm_benchmark recipe a benchmark section"
    peak = device_peak_tflops(run.env.device, bench.peak_tflops)
    layout = {**_layout(run), "warmup_steps": bench.warmup_steps}
    log.event("started", run.step, **layout, measured_steps=bench.measured_steps)
    stream, measured, record = batches(run), [], None
    meter = StepMeter(run.model, run.env.device, run.env.world_size, warn=metric_warning(run, log))
    while run.step < run.max_steps:
        record, sample = benchmark_step(run, stream, peak, meter)
        log.record(record)
        _stop_if_not_finite(record.loss, run.step)
        if run.step > bench.warmup_steps:
            measured.append(sample)
        if preemption.agreed(run.env.device):
            log.event("preempted", run.step, code="preempted", exit_code=ExitCode.PREEMPTED)
            return ExitCode.PREEMPTED
    if record is not None and run.recipe.checkpoint.enabled:
        save_checkpoint(run, log, asdict(record))
    if measured:
        log.event("benchmark_summary", run.step, **summarize(measured, bench.warmup_steps, peak))
    log.event("finished", run.step, metrics=asdict(record) if record else {})
    return ExitCode.OK
