"""Two-rank FSDP2 runs from_pretrained: the shard-only load trains exactly like the full load.

The same recipe runs twice under torchrun (gloo): once on the shard-only path (meta build,
FSDP2, each rank reads its shards) and once with `TUNEYARD_FULL_MODEL_LOAD=1` (every rank
loads the whole model, then shards). Every step's loss must agree to 1e-6, and a resume
from a checkpoint (read shard by shard too) must match the full-load resume.
"""

from __future__ import annotations

import pytest
from trainer_harness import Assets, base_recipe, launch, write_recipe

from trainer.__main__ import load_recipe
from trainer.setup import _meta_model

pytestmark = pytest.mark.slow

FSDP2 = {"strategy": "fsdp2", "activation_checkpointing": True}


def _recipe(assets: Assets, max_steps: int) -> dict:
    schedule = {"max_steps": max_steps, "checkpoint_interval": 4, "val_check_interval": 4}
    return base_recipe(assets, distributed=FSDP2, step_scheduler=schedule)


def _losses(result) -> list[float]:
    assert result.returncode == 0, result.output[-3000:]
    return [r["loss"] for r in result.records()]


def test_the_recipe_takes_the_shard_only_path(assets: Assets, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEYARD_DATA_ROOTS", str(assets.root))
    path = write_recipe(assets, "shard-only-check", _recipe(assets, 8))
    recipe = load_recipe(path, [], tmp_path)
    assert recipe is not None and _meta_model(recipe) is not None
    monkeypatch.setenv("TUNEYARD_FULL_MODEL_LOAD", "1")
    assert _meta_model(recipe) is None


def test_shard_only_losses_equal_the_full_load(assets: Assets, monkeypatch) -> None:
    new = launch(assets, "shard-only-new", _recipe(assets, 8), nproc=2)
    monkeypatch.setenv("TUNEYARD_FULL_MODEL_LOAD", "1")
    old = launch(assets, "shard-only-old", _recipe(assets, 8), nproc=2)
    new_losses, old_losses = _losses(new), _losses(old)
    assert len(new_losses) == len(old_losses) == 8
    for step, (a, b) in enumerate(zip(new_losses, old_losses, strict=True), 1):
        assert abs(a - b) <= 1e-6, (step, a, b)


def test_shard_only_resume_equals_the_full_load_resume(assets: Assets, monkeypatch) -> None:
    first = launch(assets, "shard-only-first", _recipe(assets, 8), nproc=2)
    assert first.returncode == 0, first.output[-3000:]
    resume = {"path": str(first.run_dir / "checkpoints" / "step_4")}
    recipe = {**_recipe(assets, 8), "restore_from": resume}
    new = _losses(launch(assets, "shard-only-resume-new", recipe, nproc=2))
    monkeypatch.setenv("TUNEYARD_FULL_MODEL_LOAD", "1")
    old = _losses(launch(assets, "shard-only-resume-old", recipe, nproc=2))
    assert len(new) == len(old) == 4  # steps 5..8
    for a, b in zip(new, old, strict=True):
        assert abs(a - b) <= 1e-6, (a, b)
