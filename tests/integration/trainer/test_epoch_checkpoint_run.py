"""`step_scheduler.save_checkpoint_every_epoch` in a real run: checkpoints at the steps that
end a pass over the data, including one whose gradient accumulation straddles the end, and
at the last step; none elsewhere (in-process trainer, one rank)."""

from __future__ import annotations

import pytest
from trainer_harness import Assets, base_recipe

pytestmark = pytest.mark.slow


def _recipe(assets: Assets, accumulation: int, every_epoch: bool) -> dict:
    """256 samples in batches of 32: 8 batches per pass over the data."""
    step = {"max_steps": 7, "num_epochs": 5, "grad_accumulation_steps": accumulation,
            "val_check_interval": None, "checkpoint_interval": None,
            "save_checkpoint_every_epoch": every_epoch}  # fmt: skip
    return base_recipe(assets, step_scheduler=step, dataloader={"batch_size": 32},
                       lr_scheduler={"warmup_steps": 1}, validation_dataset=None)  # fmt: skip


@pytest.mark.parametrize(
    ("accumulation", "every_epoch", "saved"),
    [
        (2, True, [4, 7]),  # 4 steps per pass: pass 0 ends at step 4; step 7 is the last
        (3, True, [3, 6, 7]),  # steps 3 and 6 each take a pass's last batch and the next's first
        (2, False, [7]),
    ],
)
def test_checkpoints_at_the_end_of_each_pass(run_main, assets, accumulation, every_epoch, saved):
    name = f"epoch-ckpt-{accumulation}-{every_epoch}"
    code, output, events = run_main(name, _recipe(assets, accumulation, every_epoch))
    assert code == 0, output[-3000:]
    assert sorted(e["step"] for e in events if e["event"] == "checkpoint_saved") == saved
