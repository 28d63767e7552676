"""Exact resume: SIGKILL every rank of a 2-rank FSDP2 run, rerun the same command.

The rerun must resume from LATEST and its losses for the later steps must equal those of
the uninterrupted FSDP2 run of `test_parallel_runs` (same recipe) to 1e-6. The recipe uses
gradient accumulation and crosses an epoch boundary, so the data position, optimizer
state, LR schedule and RNG all have to come back.
"""

from __future__ import annotations

import signal

import pytest
from trainer_harness import Assets, launch, launch_until, strategy_recipe, strategy_run

pytestmark = pytest.mark.slow


def last_per_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records}


def test_killed_run_resumes_from_latest_with_identical_losses(assets: Assets) -> None:
    clean = strategy_run(assets, "fsdp2")
    assert clean.returncode == 0, clean.output[-3000:]
    recipe = strategy_recipe(assets, "fsdp2")
    run_dir = assets.root / "runs" / "resume-killed"
    killed = launch_until(assets, "resume-killed", recipe, 2, run_dir, step=12, sig=signal.SIGKILL)
    assert killed.returncode != 0
    assert not any(e["event"] == "finished" for e in killed.events())

    resumed = launch(assets, "resume-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    resumed_event = next(e for e in resumed.events() if e["event"] == "resumed")
    start = resumed_event["step"]
    assert 10 <= start < 30 and start % 10 == 0
    expected = last_per_step(clean.records("train"))
    got = last_per_step(resumed.records("train"))
    assert sorted(got) == list(range(1, 31))
    for step in range(start + 1, 31):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["lr"] == pytest.approx(expected[step]["lr"], rel=1e-12), step
        assert got[step]["epoch"] == expected[step]["epoch"], step
    val_expected = last_per_step(clean.records("val"))
    val_got = last_per_step(resumed.records("val"))
    assert val_got[30]["val_loss"] == pytest.approx(val_expected[30]["val_loss"], abs=1e-6)
