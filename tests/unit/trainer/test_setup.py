"""Run setup: the steps a run takes follow validation's rule, the data position rescales with dp."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.recipe.typed import Checkpoint, StepScheduler
from trainer.setup import _checkpoint_manager, _data_position, steps_to_run


def schedule(max_steps, num_epochs, grad_acc=1) -> StepScheduler:
    return StepScheduler(max_steps, num_epochs, 8, 4, grad_acc, None, None, 1)


def loader(batches: int):
    return SimpleNamespace(batch_sampler=range(batches))


@pytest.mark.parametrize(
    ("max_steps", "num_epochs", "grad_acc", "expected"),
    [
        (60, None, 1, 60),  # max_steps alone: honoured across epochs (45 batches per epoch)
        (60, 1, 1, 45),  # an explicit num_epochs bounds it
        (30, 2, 1, 30),
        (None, 2, 1, 90),  # epochs alone
        (None, 3, 3, 45),  # 15 optimizer steps per epoch with 3 micro-batches each
    ],
)
def test_max_steps_is_honoured_and_num_epochs_bounds_only_when_given(
    max_steps, num_epochs, grad_acc, expected
):
    assert steps_to_run(schedule(max_steps, num_epochs, grad_acc), loader(45)) == expected


def test_data_position_is_rescaled_when_dp_size_changes() -> None:
    state = {"data": {"epoch": 1, "batches_done": 6}, "dp_size": 2}
    assert _data_position(state, 2) == {"epoch": 1, "batches_done": 6}
    assert _data_position(state, 4) == {"epoch": 1, "batches_done": 3}


@pytest.mark.parametrize("given", ["checkpoints", "own/ckpt"])
def test_a_relative_checkpoint_dir_is_under_the_run_directory(tmp_path: Path, given) -> None:
    """The server keeps a relative checkpoint_dir relative: it names a place in the run."""
    spec = Checkpoint(True, given, None, True, "safetensors", True)
    env = SimpleNamespace(is_rank0=True)
    assert _checkpoint_manager(spec, tmp_path / "run", env).root == tmp_path / "run" / given
    elsewhere = tmp_path / "ckpt" / "project" / "x"
    spec = Checkpoint(True, str(elsewhere), None, True, "safetensors", True)
    assert _checkpoint_manager(spec, tmp_path / "run", env).root == elsewhere
