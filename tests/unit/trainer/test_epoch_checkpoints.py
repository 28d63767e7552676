"""`step_scheduler.save_checkpoint_every_epoch`: a checkpoint at the step that ends a pass
over the data, also when gradient accumulation straddles the end (trainer.finetune)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.recipe.typed import StepScheduler
from trainer.finetune import _should_save, epoch_ended

BATCHES_PER_PASS = 8


def _run(epoch: int, batches_done: int, step: int = 3, enabled: bool = True):
    return SimpleNamespace(
        data_state={"epoch": epoch, "batches_done": batches_done},
        train_loader=SimpleNamespace(batch_sampler=range(BATCHES_PER_PASS)),
        recipe=SimpleNamespace(checkpoint=SimpleNamespace(enabled=enabled)),
        step=step,
        max_steps=100,
    )


def _schedule(every_epoch: bool, interval: int | None = None) -> StepScheduler:
    return StepScheduler(100, None, 8, 4, 2, None, interval, 1, every_epoch, 1)


@pytest.mark.parametrize(
    ("micro_epochs", "epoch", "batches_done", "ended"),
    [
        ((0, 0), 0, 8, True),  # took the pass's last two batches
        ((0, 0), 0, 6, False),
        ((0, 1), 1, 1, True),  # the last batch of pass 0, then the first of pass 1
        ((1, 1), 1, 2, False),  # the step after a straddling one
    ],
)
def test_a_step_ends_a_pass_when_it_takes_its_last_batch(micro_epochs, epoch, batches_done, ended):
    micro = [(e, {}) for e in micro_epochs]
    assert epoch_ended(_run(epoch, batches_done), micro) is ended


def test_the_end_of_a_pass_saves_only_when_asked():
    run = _run(0, BATCHES_PER_PASS)
    assert _should_save(run, _schedule(True), False, epoch_end=True)
    assert not _should_save(run, _schedule(False), False, epoch_end=True)
    assert not _should_save(run, _schedule(True), False, epoch_end=False)
    assert not _should_save(_run(0, 8, enabled=False), _schedule(True), False, epoch_end=True)
    assert _should_save(_run(0, 2, step=4), _schedule(False, interval=2), False)
