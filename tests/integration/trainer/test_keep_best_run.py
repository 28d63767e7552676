"""`checkpoint.keep_best` in a real run that is resumed: the run saves every 2 steps with a
validation at each, stops at step 6, and a second run over the same run directory goes on
to step 12 from LATEST. What is left on disk is exactly LATEST plus the 2 best by val_loss
over BOTH runs (mode max, so the best are early ones the first run saved: the resumed run
must rank them from what their `trainer_state.json` recorded), and every other checkpoint
has a `checkpoint_deleted` event with its reason (in-process trainer, one rank)."""

from __future__ import annotations

import json

import pytest
from trainer_harness import Assets, base_recipe, write_recipe

pytestmark = pytest.mark.slow


def _recipe(assets: Assets, max_steps: int) -> dict:
    step = {
        "max_steps": max_steps,
        "num_epochs": None,
        "grad_accumulation_steps": 1,
        "val_check_interval": 2,
        "checkpoint_interval": 2,
    }
    keep = {"keep_last": 1, "keep_best": {"metric": "val_loss", "mode": "max", "k": 2}}
    return base_recipe(
        assets, step_scheduler=step, checkpoint=keep, lr_scheduler={"warmup_steps": 1}
    )


def test_keep_best_keeps_the_right_checkpoints_across_a_resume(run_main, assets):
    from trainer.__main__ import main

    code, output, _ = run_main("keep-best", _recipe(assets, 6))
    assert code == 0, output[-3000:]
    run_dir = assets.root / "runs" / "keep-best"
    recipe_path = write_recipe(assets, "keep-best-resumed", _recipe(assets, 12))
    assert main(["--recipe", str(recipe_path), "--run-dir", str(run_dir)]) == 0

    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "resumed" and e["step"] == 6 for e in events)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val_loss"] for r in records if r["kind"] == "val"}
    assert sorted(val) == [2, 4, 6, 8, 10, 12]
    best = sorted(sorted(val, key=lambda s: (-val[s], s))[:2])
    assert min(best) <= 6, "the test means a best checkpoint the first run saved"

    root = run_dir / "checkpoints"
    kept = sorted(int(p.name.removeprefix("step_")) for p in root.glob("step_*"))
    assert kept == sorted({*best, 12})
    assert (root / "LATEST").read_text().strip() == "step_12"
    deleted = {e["step"]: e["reason"] for e in events if e["event"] == "checkpoint_deleted"}
    assert sorted(deleted) == sorted(set(val) - set(kept))
    assert all("not among the 2 best by val_loss (max)" in r for r in deleted.values())
    saved = {e["step"]: e["metrics"] for e in events if e["event"] == "checkpoint_saved"}
    assert {s: m["val_loss"] for s, m in saved.items()} == val
