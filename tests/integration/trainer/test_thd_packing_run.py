"""A two-rank torchrun run with AutoModel's THD collater and split packing: the loss falls.

The recipe spells packing as AutoModel does (`packed_sequence_size`, `split_across_pack`,
`max_packs`, `drop_long_samples`, `collate_fn: {_target_: ...packed_sequence_thd_collater}`);
the batches then carry the THD fields next to the position ids the model reads.
"""

from __future__ import annotations

from trainer_harness import Assets, base_recipe, launch

THD = "nemo_automodel.components.datasets.utils.packed_sequence_thd_collater"


def test_thd_collater_run_trains_on_two_ranks(assets: Assets) -> None:
    recipe = base_recipe(
        assets,
        step_scheduler={
            "max_steps": 10,
            "num_epochs": 5,
            "grad_accumulation_steps": 1,
            "val_check_interval": 10,
            "checkpoint_interval": 10,
        },
        packed_sequence={
            "packed_sequence_size": 48,
            "split_across_pack": True,
            "max_packs": 64,
            "drop_long_samples": False,
        },
        dataloader={"batch_size": 2, "collate_fn": {"_target_": THD}},
        validation_dataloader={"collate_fn": THD},
        checkpoint={"enabled": False},
    )
    run = launch(assets, "thd-packing", recipe, nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    losses = [r["loss"] for r in run.records()]
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses
    assert run.records("val"), "validation on packed THD batches ran"
