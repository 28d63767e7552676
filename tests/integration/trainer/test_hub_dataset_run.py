"""A two-rank torchrun run whose datasets are hub names, read offline from a hub-cache snapshot.

This is the shipped seed recipe's situation (`path_or_dataset: rajpurkar/squad` on a worker
whose cache holds the dataset): every rank resolves the name to the cached snapshot and trains.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_hub import squad_hub_rows, write_hub_dataset
from trainer_harness import Assets, base_recipe, launch

from cli.demo_assets import write_squad_dir

pytestmark = pytest.mark.slow


def test_two_ranks_train_on_a_cached_hub_squad(
    assets: Assets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "hf"
    squad = write_squad_dir(tmp_path / "squad", n=128)
    splits = {s: squad_hub_rows(squad / f"{s}.json") for s in ("train", "validation")}
    write_hub_dataset(home / "hub", "org/squad", splits)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)

    squad_target = {"_target_": "nemo_automodel.datasets.squad.SquadDataset"}
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": 16, "val_check_interval": 16, "checkpoint_interval": 16},
    )
    recipe["dataset"] = {**squad_target, "path_or_dataset": "org/squad", "max_seq_length": 64}
    recipe["validation_dataset"] = {
        **squad_target,
        "path_or_dataset": "org/squad",
        "split": "validation[:8]",
    }
    run = launch(assets, "hub-squad", recipe, nproc=2, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    losses = [r["loss"] for r in run.records()]
    assert len(losses) == 16
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4
    assert run.records("val"), "the validation split was read too"
