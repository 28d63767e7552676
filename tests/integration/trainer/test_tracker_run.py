"""The real trainer on 2 gloo ranks with both trackers on (W&B offline, MLflow in the run
dir): the trackers hold exactly the steps and losses of `metrics.jsonl`, and only rank 0
logged (one W&B run, one MLflow run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tracker_runs import isolate_trackers, mlflow_history, wandb_runs
from trainer_harness import Assets, base_recipe, benchmark_recipe, launch

pytestmark = pytest.mark.slow
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

TRACKERS = {
    "wandb": {"project": "tuneyard-it", "mode": "offline", "dir": "wandb-files"},
    "mlflow": {"experiment_name": "tuneyard-it", "tracking_uri": "file:mlruns"},
}


def finetune_recipe(assets: Assets) -> dict[str, Any]:
    schedule = {"max_steps": 6, "val_check_interval": 3, "checkpoint_interval": None}
    return base_recipe(assets, step_scheduler=schedule, checkpoint={"enabled": False}, **TRACKERS)


def tracked_benchmark_recipe(assets: Assets) -> dict[str, Any]:
    return {**benchmark_recipe(assets, warmup=1, measured=3), **TRACKERS}


@pytest.fixture
def tracker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """W&B and MLflow kept off the network and out of $HOME (the trainer inherits this)."""
    home = isolate_trackers(tmp_path / "tracker-home", monkeypatch)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the file store back here
    return home


@pytest.mark.parametrize(
    "make", [finetune_recipe, tracked_benchmark_recipe], ids=["finetune", "bench"]
)
def test_trackers_log_what_metrics_jsonl_has_from_rank_0_only(
    assets: Assets, tracker_env: Path, make
) -> None:
    run = launch(assets, f"trackers-{make.__name__}", make(assets), nproc=2, timeout=420)
    assert run.returncode == 0, run.output
    train, val = run.records("train"), run.records("val")
    assert train and [e for e in run.events() if e["event"] == "tracker_warning"] == []

    runs = wandb_runs(run.run_dir / "wandb-files")
    assert len(runs) == 1, "exactly one W&B run: rank 0's"
    (wandb,) = runs
    assert wandb.exit_code == 0 and wandb.project == "tuneyard-it"
    assert sorted(wandb.history) == [r["step"] for r in train]
    assert {s: h["loss"] for s, h in wandb.history.items()} == {r["step"]: r["loss"] for r in train}
    assert {s: h["val_loss"] for s, h in wandb.history.items() if "val_loss" in h} == {
        r["step"]: r["val_loss"] for r in val
    }
    assert not (tracker_env / "dir" / "wandb").exists()

    history = mlflow_history((run.run_dir / "mlruns").as_uri(), "tuneyard-it")  # one run
    assert history["loss"] == {r["step"]: r["loss"] for r in train}
    assert history["grad_norm"] == {r["step"]: r["grad_norm"] for r in train}
    assert history.get("val_loss", {}) == {r["step"]: r["val_loss"] for r in val}
    if make is finetune_recipe:
        assert len(train) == 6 and [r["step"] for r in val] == [3, 6]
