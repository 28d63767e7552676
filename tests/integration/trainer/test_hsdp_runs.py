"""HSDP: `fsdp2` with `dp_replicate_size: 2` on 4 gloo ranks (2 replicas x 2 shards).

One uninterrupted 4-rank run (module fixture) is checked four ways: it builds the
(dp_replicate 2, dp_shard 2) mesh and trains; its losses, gradient norms and validation
losses equal a 1-process run of the same recipe with the same global batch (16 samples
per micro-batch, 2 micro-batches per step) to 1e-5 relative, float32 (only the reduction
order differs); its checkpoints hold every rank's DCP optimizer shard and a consolidated
model that plain transformers loads with the trainer's validation loss; and a run killed
after a checkpoint resumes from it with later losses equal to the uninterrupted run's to
1e-6 (the restored HSDP optimizer DTensors, LR schedule and data position).
Attention dropout is off so a 1-rank and a 4-rank run can draw the same numbers.
"""

from __future__ import annotations

import json
import signal

import pytest
from trainer_harness import Assets, RunResult, comparison_recipe, launch, launch_until

pytestmark = pytest.mark.slow

HSDP = {"strategy": "fsdp2", "dp_replicate_size": 2}
MAX_STEPS = 12  # 8 steps per epoch: the run crosses an epoch boundary


def hsdp_recipe(assets: Assets, distributed: dict, batch_size: int) -> dict:
    return comparison_recipe(assets, distributed, batch_size, MAX_STEPS)


@pytest.fixture(scope="module")
def hsdp_run(assets: Assets) -> RunResult:
    return launch(assets, "hsdp", hsdp_recipe(assets, HSDP, 4), nproc=4)


@pytest.fixture(scope="module")
def one_process_run(assets: Assets) -> RunResult:
    recipe = hsdp_recipe(assets, {"strategy": "fsdp2"}, 16)  # 16 = 4 per rank x 4 dp ranks
    return launch(assets, "hsdp-one-process", recipe, nproc=1)


def by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records}


def test_hsdp_builds_the_2x2_mesh_and_trains(hsdp_run: RunResult) -> None:
    assert hsdp_run.returncode == 0, hsdp_run.output[-3000:]
    started = hsdp_run.events()[0]
    assert started["event"] == "started"
    assert started["mesh_shape"] == {"dp_replicate": 2, "dp_shard": 2, "tp": 1}
    assert started["dp_size"] == 4 and started["world_size"] == 4
    losses = [r["loss"] for r in hsdp_run.records("train")]
    assert len(losses) == MAX_STEPS and losses[-1] < 0.9 * losses[0]


def test_hsdp_matches_a_one_process_run_of_the_same_global_batch(
    hsdp_run: RunResult, one_process_run: RunResult
) -> None:
    assert one_process_run.returncode == 0, one_process_run.output[-3000:]
    hsdp, single = hsdp_run.records("train"), one_process_run.records("train")
    assert [r["step"] for r in hsdp] == [r["step"] for r in single] == list(range(1, 13))
    for got, want in zip(hsdp, single, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), got["step"]
        assert got["num_tokens"] == want["num_tokens"], got["step"]
    for got, want in zip(hsdp_run.records("val"), one_process_run.records("val"), strict=True):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)


def test_hsdp_checkpoint_holds_every_shard_and_a_loadable_model(
    hsdp_run: RunResult, assets: Assets, offline_hub
) -> None:
    from trainer_harness import transformers_val_loss

    latest = hsdp_run.latest()
    assert latest.name == f"step_{MAX_STEPS}"
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["world_size"] == 4 and state["dp_size"] == 4 and len(state["rng"]) == 4
    assert sorted(p.name for p in (latest / "optim").glob("*.distcp")) == [
        f"__{rank}_0.distcp" for rank in range(4)
    ]
    val_loss = transformers_val_loss(latest / "model", assets.val)
    assert val_loss == pytest.approx(hsdp_run.records("val")[-1]["val_loss"], rel=1e-4)


def test_killed_hsdp_run_resumes_with_identical_losses(hsdp_run: RunResult, assets: Assets) -> None:
    recipe = hsdp_recipe(assets, HSDP, 4)
    run_dir = assets.root / "runs" / "hsdp-killed"
    killed = launch_until(assets, "hsdp-killed", recipe, 4, run_dir, step=6, sig=signal.SIGKILL)
    assert killed.returncode != 0
    assert not any(e["event"] == "finished" for e in killed.events())

    resumed = launch(assets, "hsdp-killed", recipe, nproc=4, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    start = next(e for e in resumed.events() if e["event"] == "resumed")["step"]
    assert 4 <= start < MAX_STEPS and start % 4 == 0
    expected, got = by_step(hsdp_run.records("train")), by_step(resumed.records("train"))
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in range(start + 1, MAX_STEPS + 1):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["grad_norm"] == pytest.approx(expected[step]["grad_norm"], abs=1e-6)
        assert got[step]["lr"] == pytest.approx(expected[step]["lr"], rel=1e-12), step
    val_expected, val_got = by_step(hsdp_run.records("val")), by_step(resumed.records("val"))
    assert val_got[MAX_STEPS]["val_loss"] == pytest.approx(
        val_expected[MAX_STEPS]["val_loss"], abs=1e-6
    )
