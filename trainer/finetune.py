"""The fine-tuning loop: one optimizer step reads top to bottom, nanoGPT style.

`train(run, log)` runs steps until `max_steps`: gradient accumulation over micro-batches,
global-norm clipping, optimizer and LR step, one MetricsSample per step, validation every
`val_check_interval`, a checkpoint every `checkpoint_interval`, at the end of each pass over
the data with `save_checkpoint_every_epoch`, and at the end. The loss of a step is the sum
of token losses over all micro-batches and data-parallel ranks divided by their
label-token count, so it does not depend on how the batch is split.
SIGTERM finishes the step, saves and exits PREEMPTED; a non-finite loss exits NAN_LOSS.
With `checkpoint.is_async` a save returns once its state is snapshotted and publishes in
the background; the next save, a preemption and the end of training wait for it first.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.typed import StepScheduler
from trainer import pipeline as pipeline_parallel
from trainer.checkpoint import hf_export, manager
from trainer.context_parallel import shard_batch
from trainer.distributed import all_reduce_sum
from trainer.errors import TrainerError
from trainer.forward import forward_logits
from trainer.loss import token_loss_sum
from trainer.metrics import RunLog, StepMeter, ValRecord, rank_peak_memory
from trainer.parallelize import clip_grad_norm
from trainer.resilience import fingerprint
from trainer.resilience.recovery import DivergenceGuard
from trainer.sample_log import StepRows
from trainer.setup import TrainingRun
from trainer.train_state import gather_rng, recipe_hash


class Preemption:
    """SIGTERM sets a flag; ranks agree on it after each step (all-reduce max)."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def batches(run: TrainingRun) -> Iterator[tuple[int, dict[str, Any]]]:
    """(epoch, batch) forever, from the checkpointed position; keeps `run.data_state` exact."""
    sampler = run.train_loader.batch_sampler
    while True:
        sampler.load_state_dict(run.data_state)
        for batch in run.train_loader:
            run.data_state["batches_done"] += 1
            yield run.data_state["epoch"], batch
        run.data_state = {"epoch": run.data_state["epoch"] + 1, "batches_done": 0}


def micro_batch_loss(run: TrainingRun, batch: dict[str, Any]) -> torch.Tensor:
    """One micro-batch's training loss summed over label tokens: the student's cross entropy,
    or the recipe's own mix when it sets `run.step_loss` (distillation's CE + KD)."""
    if run.step_loss is not None:
        return run.step_loss(run, batch)
    logits = forward_logits(run, batch)
    return token_loss_sum(run.loss_fn, logits, batch["labels"].to(run.env.device))


def _sync_context(run: TrainingRun, last: bool):
    no_sync = getattr(run.forward_model, "no_sync", None)  # DDP: reduce once per step
    return contextlib.nullcontext() if last or no_sync is None else no_sync()


def train_step(run: TrainingRun, micro_batches: list[dict[str, Any]]) -> tuple[float, float, int]:
    """One optimizer step; returns (loss, grad_norm, tokens) summed over all ranks."""
    if run.pipeline is not None:
        return pipeline_parallel.train_step(run, micro_batches)
    tp = run.topology.tp_size
    micro_batches = [shard_batch(b, run.topology) for b in micro_batches]
    local_labels = sum(int((b["labels"] != -100).sum()) for b in micro_batches)
    label_tokens = max(1.0, all_reduce_sum([local_labels], run.env.device)[0] / tp)
    loss_sum = 0.0
    for i, batch in enumerate(micro_batches):
        with _sync_context(run, last=i == len(micro_batches) - 1):
            loss = micro_batch_loss(run, batch)
            # FSDP averages gradients over dp x cp ranks; each holds a share of the tokens
            (loss * run.topology.dp_size * run.topology.cp_size / label_tokens).backward()
        loss_sum += float(loss.detach())
    max_norm = run.recipe.clip_grad_norm.max_norm
    grad_norm = clip_grad_norm([p for p in run.model.parameters() if p.requires_grad], max_norm)
    run.optimizer.step()
    if run.scheduler is not None:
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = sum(b["num_tokens"] for b in micro_batches)
    total_loss, total_tokens = all_reduce_sum([loss_sum, tokens], run.env.device)
    return total_loss / tp / label_tokens, grad_norm, int(total_tokens / tp)


@torch.no_grad()
def validate(run: TrainingRun) -> tuple[float, int]:
    if run.pipeline is not None:
        return pipeline_parallel.validate(run)
    run.model.train(False)
    loss_sum, labels, tokens = 0.0, 0, 0
    for batch in run.val_loader:
        batch = shard_batch(batch, run.topology)
        logits = forward_logits(run, batch)
        target = batch["labels"].to(run.env.device)
        loss_sum += float(token_loss_sum(run.loss_fn, logits, target))
        labels += int((batch["labels"] != -100).sum())
        tokens += batch["num_tokens"]
    run.model.train(True)
    loss_sum, labels, tokens = all_reduce_sum([loss_sum, labels, tokens], run.env.device)
    return loss_sum / max(1.0, labels), int(tokens / run.topology.tp_size)


def save_checkpoint(
    run: TrainingRun, log: RunLog, last_record: dict[str, Any], final: bool | None = None
) -> None:
    """Save at `run.step`. With `checkpoint.is_async` only the snapshot blocks, unless this
    is the run's last save (`final`; by default, at max_steps), which waits for it."""
    checkpoints = run.checkpoints
    log.checkpoints_saved(checkpoints.wait())  # the previous asynchronous save, published
    staging = checkpoints.begin(run.step)
    state = {**trainer_state(run), "metrics": last_record}  # what keep_best ranks it by
    if checkpoints.is_async:
        _save_async(run, staging, state, last_record)
        if final if final is not None else run.step >= run.max_steps:
            log.checkpoints_saved(checkpoints.wait())
        return
    hf_export.save_model_dir(run, staging)
    if checkpoints.save_optimizer:
        flat = run.pipeline is not None  # stages hold different parameters
        manager.save_optimizer(run.model, run.optimizer, run.scheduler, staging / "optim", flat)
    path = checkpoints.publish(run.step, state)
    if run.env.is_rank0:
        size = manager.dir_size(path)
        deleted = checkpoints.take_deletions()
        log.checkpoints_saved([manager.PublishedSave(run.step, path, size, last_record, deleted)])


def _save_async(
    run: TrainingRun, staging: Path, state: dict[str, Any], last_record: dict[str, Any]
) -> None:
    write_model = hf_export.snapshot_model_dir(run, staging)
    shards, group = None, run.checkpoints.process_group
    if run.checkpoints.save_optimizer:
        optim_dir = staging / "optim"
        shards = manager.async_save_optimizer(
            run.model, run.optimizer, run.scheduler, optim_dir, group
        )
    run.checkpoints.publish_async(run.step, state, shards, write_model, last_record)


def trainer_state(run: TrainingRun) -> dict[str, Any]:
    """What `trainer_state.json` records: position, every rank's RNG, identity (all ranks)."""
    return {
        "step": run.step,
        "epoch": run.data_state["epoch"],
        "data": dict(run.data_state),
        "rng": gather_rng(),
        "recipe_hash": recipe_hash(run.recipe.to_json()),
        "architecture": run.architecture,
        "peft": run.is_peft,
        "world_size": run.env.world_size,
        "dp_size": run.topology.dp_size,
        "skipped_batches": sorted([list(p) for p in run.skipped_batches]),
        "fingerprint": fingerprint.compute(run),  # checked after a resume (trainer.resilience)
    }


def _stop_if_not_finite(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise TrainerError(
            ExitCode.NAN_LOSS,
            f"loss became {loss} at step {step}; lower optimizer.lr or set clip_grad_norm.max_norm",
        )


def _due(step: int, interval: Any) -> bool:
    return bool(interval) and step % int(interval) == 0


Loop = Callable[[TrainingRun, RunLog, Preemption], ExitCode]


def with_preemption(loop: Loop, run: TrainingRun, log: RunLog) -> ExitCode:
    """Run a step loop with SIGTERM caught as a preemption request, restored afterwards."""
    preemption = Preemption()
    try:
        code = loop(run, log, preemption)
    except BaseException:
        _finish_saves_quietly(run)
        raise
    finally:
        preemption.restore()
    return code


def _finish_saves_quietly(run: TrainingRun) -> None:
    """A failing run still lets a save in flight publish; its own failure is only printed."""
    try:
        run.checkpoints.wait()
    except TrainerError as exc:
        print(f"[rank {run.env.rank}] {exc.message}", flush=True)


def train(run: TrainingRun, log: RunLog) -> ExitCode:
    log.open_trackers(run.recipe)
    return with_preemption(_train_loop, run, log)


def metric_warning(run: TrainingRun, log: RunLog) -> Callable[[str], None]:
    """A `metric_warning` event at the current step: a figure the run goes on without."""
    return lambda message: log.event("metric_warning", run.step, metric="mfu", message=message)


def _train_loop(run: TrainingRun, log: RunLog, preemption: Preemption) -> ExitCode:
    schedule = run.recipe.step_scheduler
    meter = StepMeter(run.model, run.env.device, run.env.world_size, warn=metric_warning(run, log))
    _announce_start(run, log)
    rows = StepRows(log.run_dir, run.env.is_rank0)  # which dataset rows made each step
    guard = DivergenceGuard(run.recipe.recovery, rows)
    stream, record = rows.tracked(batches(run), run), None
    while run.step < run.max_steps:
        start = time.perf_counter()
        micro = [next(stream) for _ in range(run.grad_accumulation_steps)]
        epoch, micro_batches = micro[0][0], [batch for _, batch in micro]
        positions = rows.take()
        guard.inject_fault(run, positions)  # tests only (TUNEYARD_TEST_POISON_ROWS)
        lr = run.optimizer.param_groups[0]["lr"]
        loss, grad_norm, tokens = train_step(run, micro_batches)
        run.step += 1
        seq_len = micro_batches[0]["input_ids"].shape[1]
        record = meter.train_record(run.step, epoch, loss, grad_norm, lr, tokens, seq_len, start)
        log.record(record)
        rows.write_step(run, run.step, positions)
        if guard.check(run, log, loss, positions):  # rolled back (recovery:); else raises
            stream = rows.tracked(batches(run), run)
            continue
        saved = asdict(record)  # what a checkpoint at this step records: its own step's
        if run.val_loader is not None and _due(run.step, schedule.val_check_interval):
            val_loss, val_tokens = validate(run)
            log.record(ValRecord(run.step, epoch, val_loss, val_tokens, time.time()))
            log.event("validation", run.step, val_loss=val_loss)
            saved["val_loss"] = val_loss
        preempted = preemption.agreed(run.env.device)
        if _should_save(run, schedule, preempted, epoch_ended(run, micro)):
            save_checkpoint(run, log, saved, final=preempted or None)
        log.checkpoints_saved(run.checkpoints.completed())
        if preempted:
            log.checkpoints_saved(run.checkpoints.wait())
            log.event("preempted", run.step, code="preempted", exit_code=ExitCode.PREEMPTED)
            return ExitCode.PREEMPTED
    log.checkpoints_saved(run.checkpoints.wait())
    peaks = rank_peak_memory(run.env.device)  # a collective: every rank reaches this line
    log.event(
        "finished", run.step, metrics=asdict(record) if record else {}, peak_memory_bytes=peaks
    )
    return ExitCode.OK


def _announce_start(run: TrainingRun, log: RunLog) -> None:
    peaks = rank_peak_memory(run.env.device)  # after the model is built (or restored), sharded
    if run.resumed_from is not None:
        log.event(
            "resumed",
            run.step,
            path=str(run.resumed_from),
            recipe_changed=run.recipe_changed,
            peak_memory_bytes=peaks,
        )
        fingerprint.verify_resume(run, log)  # resume_verified, or resume_mismatch and fail
    else:
        log.event("started", run.step, **_layout(run), peak_memory_bytes=peaks)


def _layout(run: TrainingRun) -> dict[str, Any]:
    """What this run really is: steps, batches and the mesh this rank built."""
    return {
        "max_steps": run.max_steps,
        "world_size": run.env.world_size,
        "mesh_shape": run.topology.mesh_shape(),
        "dp_size": run.topology.dp_size,
        "tp_size": run.topology.tp_size,
        "ep_size": run.topology.ep_size,
        "grad_accumulation_steps": run.grad_accumulation_steps,
        "local_batch_size": run.train_loader.batch_sampler.batch_size,
    }


def epoch_ended(run: TrainingRun, micro: list[tuple[int, Any]]) -> bool:
    """This step took the last micro-batch of a pass over the data, or crossed into the next
    pass (gradient accumulation may straddle the end). Every rank has as many batches per
    pass, so all ranks agree."""
    last_of_pass = run.data_state["batches_done"] >= len(run.train_loader.batch_sampler)
    return last_of_pass or micro[-1][0] != micro[0][0]


def _should_save(
    run: TrainingRun, schedule: StepScheduler, preempted: bool, epoch_end: bool = False
) -> bool:
    if not run.recipe.checkpoint.enabled:
        return False
    if preempted or run.step == run.max_steps or _due(run.step, schedule.checkpoint_interval):
        return True
    return epoch_end and schedule.save_checkpoint_every_epoch
