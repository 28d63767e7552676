"""`checkpoint.is_async: true` on a 2-rank FSDP2 run (gloo): same training, atomic publish.

The asynchronous run must train exactly as the synchronous FSDP2 run of
`test_parallel_runs` (same recipe otherwise: the snapshot taken at a save must not perturb
the step loop) and publish every checkpoint whole. Then a run is SIGKILLed while a save is
in flight: `TUNEYARD_TEST_PUBLISH_DELAY_S` holds each background publish a few seconds
before its rename, so the kill lands after step 22 trained while step 20's save was
still unpublished. LATEST must still name step_10, the staging dir must not be resumed
from, and the rerun must resume from step 10 with later losses equal to the synchronous
run's to 1e-6.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from trainer_harness import (
    REPO,
    Assets,
    RunResult,
    launch,
    strategy_recipe,
    strategy_run,
    trainer_command,
    trainer_env,
    transformers_val_loss,
    write_recipe,
)

from trainer.checkpoint.manager import PUBLISH_DELAY_ENV, is_complete

pytestmark = pytest.mark.slow


def async_recipe(assets: Assets) -> dict:
    recipe = strategy_recipe(assets, "fsdp2")
    recipe["checkpoint"] = {**recipe["checkpoint"], "is_async": True}
    return recipe


def by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records}


def _trained_to(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return 0
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return max((r["step"] for r in lines if r["kind"] == "train"), default=0)


def _latest_name(run_dir: Path) -> str | None:
    pointer = run_dir / "checkpoints" / "LATEST"
    return pointer.read_text().strip() if pointer.exists() else None


def kill_during_save(assets: Assets, name: str, recipe: dict, run_dir: Path) -> bool:
    """Run with slow publishes; SIGKILL every rank once step 22 trained while step 20's save
    is unpublished. Returns whether that moment was reached (else it killed at timeout)."""
    env = {**trainer_env(assets), PUBLISH_DELAY_ENV: "8"}
    command = trainer_command(write_recipe(assets, name, recipe), run_dir, 2)
    proc = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    staging, reached = run_dir / "checkpoints" / ".staging_step_20", False
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not reached:
        reached = (
            _trained_to(run_dir) >= 22 and staging.is_dir() and _latest_name(run_dir) == "step_10"
        )
        time.sleep(0.05)
    tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    return reached


def test_async_run_trains_as_the_sync_run_and_publishes_every_checkpoint(
    assets: Assets, offline_hub
) -> None:
    sync = strategy_run(assets, "fsdp2")
    run = launch(assets, "async-fsdp2", async_recipe(assets), nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    expected, got = by_step(sync.records("train")), by_step(run.records("train"))
    assert sorted(got) == list(range(1, 31))
    for step, record in got.items():
        assert record["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert record["grad_norm"] == pytest.approx(expected[step]["grad_norm"], abs=1e-6)
    events = run.events()
    saved = [e for e in events if e["event"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [10, 20, 30] and events[-1]["event"] == "finished"
    assert all(e["size_bytes"] > 0 and e["metrics"]["step"] == e["step"] for e in saved)
    root = run.run_dir / "checkpoints"
    assert run.latest().name == "step_30" and not list(root.glob(".staging_*"))
    assert sorted(p.name for p in root.glob("step_*")) == ["step_20", "step_30"]
    assert sorted(p.name for p in (run.latest() / "optim").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    val_loss = transformers_val_loss(run.latest() / "model", assets.val)
    assert val_loss == pytest.approx(run.records("val")[-1]["val_loss"], rel=1e-4)


def test_kill_during_an_async_save_keeps_latest_and_the_rerun_resumes_exactly(
    assets: Assets,
) -> None:
    sync = strategy_run(assets, "fsdp2")
    recipe, run_dir = async_recipe(assets), assets.root / "runs" / "async-killed"
    assert kill_during_save(assets, "async-killed", recipe, run_dir), "no save was in flight"
    root = run_dir / "checkpoints"
    assert _latest_name(run_dir) == "step_10"  # never the checkpoint being written
    assert (root / ".staging_step_20").is_dir() and not (root / "step_20").exists()
    assert not is_complete(root / ".staging_step_20")

    resumed = launch(assets, "async-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    resumed_event = next(e for e in resumed.events() if e["event"] == "resumed")
    assert resumed_event["step"] == 10 and resumed_event["path"] == str(root / "step_10")
    assert not list(root.glob(".staging_*")) and _latest_name(run_dir) == "step_30"
    expected: dict[int, dict] = by_step(sync.records("train"))
    got = by_step(RunResult(run_dir, 0, "").records("train"))
    assert sorted(got) == list(range(1, 31))
    for step in range(11, 31):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["lr"] == pytest.approx(expected[step]["lr"], rel=1e-12), step
    val_expected, val_got = by_step(sync.records("val")), by_step(resumed.records("val"))
    assert val_got[30]["val_loss"] == pytest.approx(val_expected[30]["val_loss"], abs=1e-6)
