"""Resume proof, step rows and divergence recovery with the real trainer (tiny Llama, CPU).

A 2-rank FSDP2 run is SIGKILLed mid-run and rerun: the resume is proven (`resume_verified`)
and `samples.jsonl` names, for every step of both runs, exactly the rows the sampler hands
each data-parallel rank (recomputed here from `ResumableBatchSampler` itself). A checkpoint
with one tensor changed fails its resume with `resume_mismatch` naming that tensor. A row
that turns the weights to NaN (`TUNEYARD_TEST_POISON_ROWS`) fails the run at its step by
default, naming the row; with `recovery.on_nan: rollback` the run rolls back to LATEST,
skips that step's rows and finishes; with more bad steps than `recovery.max_retries` it
fails naming the rows.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from trainer_harness import Assets, base_recipe, launch, launch_until, strategy_recipe

from jobs.recipe.exit_codes import ExitCode
from trainer.data.sampler import ResumableBatchSampler
from trainer.resilience.recovery import POISON_ENV, SPIKE_ENV

pytestmark = pytest.mark.slow
SEED, BATCH, ACCUMULATION = 7, 4, 2  # base_recipe's rng.seed, batch_size, grad accumulation


def sampler_rows(num_samples: int, dp_size: int, steps: int) -> dict[int, list[tuple]]:
    """Step -> [(index, dp_rank, micro_batch)] as the sampler yields them, epoch after epoch."""
    per_rank = []
    for rank in range(dp_size):
        batches: list[list[int]] = []
        sampler = ResumableBatchSampler(num_samples, BATCH, rank, dp_size, True, SEED, True)
        epoch = 0
        while len(batches) < steps * ACCUMULATION:
            sampler.load_state_dict({"epoch": epoch, "batches_done": 0})
            batches += list(iter(sampler))
            epoch += 1
        per_rank.append(batches)
    expected = {}
    for step in range(1, steps + 1):
        rows = []
        for micro in range(ACCUMULATION):
            number = (step - 1) * ACCUMULATION + micro
            for rank in range(dp_size):
                rows += [(index, rank, micro) for index in per_rank[rank][number]]
        expected[step] = rows
    return expected


def sample_lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


def step_rows(lines: list[dict]) -> dict[int, list[tuple]]:
    """The last rows written for each step."""
    return {
        line["step"]: [(r["index"], r["dp_rank"], r["micro_batch"]) for r in line["rows"]]
        for line in lines
        if line["kind"] == "step"
    }


def test_killed_run_resumes_verified_and_every_step_names_the_sampler_rows(
    assets: Assets,
) -> None:
    recipe = strategy_recipe(assets, "fsdp2")  # 30 steps, dp 2, checkpoints every 10
    run_dir = assets.root / "runs" / "proof-killed"
    killed = launch_until(assets, "proof-killed", recipe, 2, run_dir, step=13, sig=signal.SIGKILL)
    assert killed.returncode != 0
    before = sample_lines(run_dir)
    expected = sampler_rows(256, 2, 30)
    first_run = step_rows(before)
    assert len(first_run) >= 13
    for step, rows in first_run.items():
        assert rows == expected[step], step

    resumed = launch(assets, "proof-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-12000:]
    events = resumed.events()
    start = next(e for e in events if e["event"] == "resumed")["step"]
    verified = [e for e in events if e["event"] == "resume_verified"]
    assert start == 10 and [e["step"] for e in verified] == [10]
    assert verified[0]["tensors"]["parameters"] > 0 and verified[0]["tensors"]["optimizer"] > 0
    assert verified[0]["compared"] == ["parameters", "optimizer", "probe_loss"]
    assert not any(e["event"] == "resume_mismatch" for e in events)
    after = sample_lines(run_dir)
    assert step_rows(after) == expected  # steps 11.. rewritten by the resumed run, identically
    rerun = [x["step"] for x in after[len(before) :] if x["kind"] == "step"]
    assert rerun == list(range(11, 31))  # the resumed run wrote exactly the steps it ran
    prompts = [json.loads(x)["prompt"] for x in assets.train.read_text().splitlines()]
    previews = {x["index"]: x for x in after if x["kind"] == "row"}
    assert set(previews) == {i for rows in expected.values() for i, _, _ in rows}
    for index, line in previews.items():
        assert prompts[index] in line["preview"] and line["tokens"] > 0

    # onto one process: shard digests do not compare across meshes, the probe loss does
    longer = {**recipe, "step_scheduler": {**recipe["step_scheduler"], "max_steps": 31}}
    one = launch(assets, "proof-killed", longer, nproc=1, run_dir=run_dir)
    assert one.returncode == 0, one.output[-3000:]
    moved = [e for e in one.events() if e["event"] == "resume_verified"][-1]
    assert moved["step"] == 30 and moved["compared"] == ["probe_loss"]


def short_recipe(assets: Assets, max_steps: int, **sections) -> dict:
    schedule = {"max_steps": max_steps, "checkpoint_interval": 4, "val_check_interval": None}
    return base_recipe(assets, step_scheduler=schedule, **sections)


def test_one_changed_tensor_fails_the_resume_naming_it(run_main, assets: Assets) -> None:
    code, output, _ = run_main("proof-corrupt", short_recipe(assets, 4))
    assert code == 0, output[-2000:]
    checkpoint = assets.root / "runs" / "proof-corrupt" / "checkpoints" / "step_4"
    weights = load_file(checkpoint / "model" / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name] = weights[name].clone()
    weights[name][0, 0] += 4.0  # one value of one tensor
    save_file(weights, checkpoint / "model" / "model.safetensors", metadata={"format": "pt"})

    resume = short_recipe(assets, 6, restore_from={"path": str(checkpoint)})
    code, output, events = run_main("proof-corrupt-resume", resume)
    assert code == ExitCode.CHECKPOINT_ERROR, output[-2000:]
    mismatch = next(e for e in events if e["event"] == "resume_mismatch")
    assert mismatch["step"] == 4
    assert mismatch["parts"][0] == f"parameters: {name}"  # only that tensor differs
    assert any(part.startswith("probe_loss:") for part in mismatch["parts"])
    assert not any(p.startswith("optimizer") for p in mismatch["parts"])
    assert events[-1]["event"] == "failed" and name in events[-1]["message"]
    assert not any(e["event"] == "resume_verified" for e in events)


def poisoned_row(step: int) -> int:
    """A row the sampler gives `step` of a one-rank run."""
    return sampler_rows(256, 1, step)[step][0][0]


def test_a_nan_step_fails_by_default_naming_its_rows(run_main, assets, monkeypatch) -> None:
    monkeypatch.setenv(POISON_ENV, str(poisoned_row(6)))
    code, output, events = run_main("proof-nan-default", short_recipe(assets, 12))
    assert code == ExitCode.NAN_LOSS, output[-2000:]
    failed = events[-1]
    assert failed["event"] == "failed" and failed["step"] == 6
    assert f"dataset rows {poisoned_row(6)}" in failed["message"]
    assert not any(e["event"] == "rollback" for e in events)


def test_on_nan_rollback_skips_the_rows_and_finishes(run_main, assets, monkeypatch) -> None:
    bad = poisoned_row(6)
    monkeypatch.setenv(POISON_ENV, str(bad))
    recovery = {"on_nan": "rollback", "lr_scale": 0.5}
    code, output, events = run_main("proof-rollback", short_recipe(assets, 12, recovery=recovery))
    assert code == 0, output[-2000:]
    rollback = next(e for e in events if e["event"] == "rollback")
    assert (rollback["step"], rollback["to_step"], rollback["reason"]) == (6, 4, "nan")
    assert bad in [r["index"] for r in rollback["skipped_rows"]]
    assert rollback["skipped_batches"] == [[0, 10], [0, 11]] and rollback["lr_scale"] == 0.5
    names = [e["event"] for e in events]
    assert names.index("rollback") < names.index("resume_verified") < names.index("finished")
    run_dir = assets.root / "runs" / "proof-rollback"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = {r["step"]: r for r in records if r["kind"] == "train"}
    assert sorted(final) == list(range(1, 13))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in final.values())
    rows = step_rows(sample_lines(run_dir))
    expected = sampler_rows(256, 1, 13)
    assert rows[5] == expected[5] and bad not in [i for i, _, _ in rows[6]]
    assert rows[6] == [(i, 0, m) for i, _, m in expected[7]]  # step 6 took the next batches
    state = json.loads((run_dir / "checkpoints" / "step_12" / "trainer_state.json").read_text())
    assert state["skipped_batches"] == [[0, 10], [0, 11]]  # a later resume skips them too


def test_a_rollback_keeps_the_runs_checkpoint_manager(run_main, assets, monkeypatch) -> None:
    """With asynchronous saves the rebuilt run keeps the one manager (its publisher thread
    and, on several ranks, its gloo group) instead of opening another per rollback; the
    saves after the rollback still publish."""
    from trainer.checkpoint import manager

    made: list[int] = []
    real_init = manager.CheckpointManager.__init__

    def counted(self, *args, **kwargs):
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(manager.CheckpointManager, "__init__", counted)
    monkeypatch.setenv(POISON_ENV, str(poisoned_row(6)))
    recipe = short_recipe(assets, 12, recovery={"on_nan": "rollback"},
                          checkpoint={"is_async": True})  # fmt: skip
    code, output, events = run_main("proof-rollback-async", recipe)
    assert code == 0, output[-2000:]
    assert [e["step"] for e in events if e["event"] == "rollback"] == [6]
    assert made == [1]
    saved = sorted(e["step"] for e in events if e["event"] == "checkpoint_saved")
    assert {4, 8, 12} <= set(saved), saved
    checkpoints = assets.root / "runs" / "proof-rollback-async" / "checkpoints"
    assert (checkpoints / "LATEST").read_text().strip() == "step_12"


def test_more_bad_steps_than_retries_fail_naming_the_rows(run_main, assets, monkeypatch) -> None:
    monkeypatch.setenv(POISON_ENV, f"{poisoned_row(6)},{poisoned_row(10)}")
    recovery = {"on_nan": "rollback", "max_retries": 1}
    code, output, events = run_main("proof-retries", short_recipe(assets, 12, recovery=recovery))
    assert code == ExitCode.NAN_LOSS, output[-2000:]
    assert [e["step"] for e in events if e["event"] == "rollback"] == [6]
    failed = events[-1]
    assert failed["event"] == "failed" and "after 1 rollbacks" in failed["message"]
    assert str(poisoned_row(10)) in failed["message"]


def test_on_spike_rolls_back_a_loss_above_the_moving_median(run_main, assets, monkeypatch):
    bad = poisoned_row(7)
    monkeypatch.setenv(SPIKE_ENV, str(bad))
    recovery = {"on_spike": {"factor": 3, "window": 3}}
    code, output, events = run_main("proof-spike", short_recipe(assets, 10, recovery=recovery))
    assert code == 0, output[-2000:]
    rollback = next(e for e in events if e["event"] == "rollback")
    assert (rollback["step"], rollback["to_step"], rollback["reason"]) == (7, 4, "spike")
    assert bad in [r["index"] for r in rollback["skipped_rows"]]
    run_dir = assets.root / "runs" / "proof-spike"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    spiked = losses[6]  # the first step 7
    assert spiked > 3 * sorted(losses[3:6])[1]
    final = {r["step"]: r["loss"] for r in records if r["kind"] == "train"}
    assert max(final.values()) < spiked / 3  # the spike is gone from the run's record


def test_two_rank_fsdp2_rollback_rebuilds_every_rank(assets: Assets, monkeypatch) -> None:
    bad = sampler_rows(256, 2, 6)[6][-1][0]  # a row of rank 1's second micro-batch
    monkeypatch.setenv(POISON_ENV, str(bad))
    recipe = short_recipe(assets, 8, recovery={"on_nan": "rollback"},
                          distributed={"strategy": "fsdp2"})  # fmt: skip
    run = launch(assets, "proof-fsdp2-rollback", recipe, nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    events = run.events()
    rollback = next(e for e in events if e["event"] == "rollback")
    assert (rollback["step"], rollback["to_step"]) == (6, 4)
    assert {r["dp_rank"] for r in rollback["skipped_rows"]} == {0, 1}
    verified = [e for e in events if e["event"] == "resume_verified"]
    assert [e["step"] for e in verified] == [4] and events[-1]["event"] == "finished"
    rows = step_rows(sample_lines(run.run_dir))
    assert rows[6] == sampler_rows(256, 2, 7)[7] and sorted(rows) == list(range(1, 9))
