"""Context parallelism: `cp_size: 2` jobs train to the end and equal a 1-process run.

A cp 2 run on 2 gloo ranks and a cp 2 x dp_shard 2 run on 4 ranks (with activation
checkpointing) each build their mesh (the cp axis beside dp_shard, FSDP2 sharding over
both), train the tiny native Llama to the end and report losses, gradient norms, token
counts and validation losses equal to a 1-process run of the same global batch (to 1e-5
relative, float32: only the reduction order differs); so do cp 2 x tp 2 with sequence
parallelism on 4 ranks, LoRA under cp 2, and packed rows under cp 2 (documents masked over
global positions, RoPE at document-local positions). Rows have uneven lengths, so each batch is
right-padded to a multiple of 2*cp before it is cut into the ranks' chunk pairs. The cp 2
run's checkpoint loads in plain transformers with the trainer's validation loss, and a
cp 2 run killed after its first checkpoint resumes from it with later losses equal to the
uninterrupted run's to 1e-6. Attention dropout is off so runs with different layouts draw
the same numbers.
"""

from __future__ import annotations

import signal

import pytest
from trainer_harness import Assets, RunResult, comparison_recipe, launch, launch_until

pytestmark = pytest.mark.slow

MAX_STEPS = 8
CP = {"strategy": "fsdp2", "cp_size": 2}


def cp_recipe(assets: Assets, distributed: dict, batch_size: int) -> dict:
    return comparison_recipe(assets, distributed, batch_size, MAX_STEPS)


@pytest.fixture(scope="module")
def cp_run(assets: Assets) -> RunResult:
    return launch(assets, "cp2", cp_recipe(assets, CP, 4), nproc=2)


@pytest.fixture(scope="module")
def one_process_run(assets: Assets) -> RunResult:
    return launch(assets, "cp-one-process", cp_recipe(assets, {"strategy": "fsdp2"}, 4))


def by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records}


def assert_same_training(got_run: RunResult, want_run: RunResult, validations: int = 2) -> None:
    assert want_run.returncode == 0, want_run.output[-3000:]
    got, want = got_run.records("train"), want_run.records("train")
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, MAX_STEPS + 1))
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-5), g["step"]
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5), g["step"]
        assert g["num_tokens"] == w["num_tokens"], g["step"]
    val_got, val_want = got_run.records("val"), want_run.records("val")
    assert len(val_got) == len(val_want) == validations
    for g, w in zip(val_got, val_want, strict=True):
        assert g["val_loss"] == pytest.approx(w["val_loss"], rel=1e-5)


def test_cp2_builds_its_mesh_and_trains_to_the_end(cp_run: RunResult) -> None:
    assert cp_run.returncode == 0, cp_run.output[-3000:]
    started = cp_run.events()[0]
    assert started["event"] == "started"
    assert started["mesh_shape"] == {"dp_shard": 1, "cp": 2, "tp": 1}
    assert started["dp_size"] == 1 and started["world_size"] == 2
    assert cp_run.events()[-1]["event"] == "finished"
    losses = [r["loss"] for r in cp_run.records("train")]
    assert len(losses) == MAX_STEPS and losses[-1] < 0.9 * losses[0]


def test_cp2_matches_a_one_process_run(cp_run: RunResult, one_process_run: RunResult) -> None:
    assert_same_training(cp_run, one_process_run)


def test_cp2_by_dp2_on_four_ranks_matches_a_one_process_run(assets: Assets) -> None:
    # with activation checkpointing: the recomputed forward all-gathers K/V again
    distributed = {**CP, "activation_checkpointing": True}
    run = launch(assets, "cp2-dp2", cp_recipe(assets, distributed, 4), nproc=4)
    assert run.returncode == 0, run.output[-3000:]
    started = run.events()[0]
    assert started["mesh_shape"] == {"dp_shard": 2, "cp": 2, "tp": 1}
    assert started["dp_size"] == 2
    single = launch(assets, "cp2-dp2-one-process", cp_recipe(assets, {"strategy": "fsdp2"}, 8))
    assert_same_training(run, single)


def test_cp2_by_tp2_with_sequence_parallel_matches_a_one_process_run(
    assets: Assets, one_process_run: RunResult
) -> None:
    distributed = {**CP, "tp_size": 2, "sequence_parallel": True}
    run = launch(assets, "cp2-tp2", cp_recipe(assets, distributed, 4), nproc=4)
    assert run.returncode == 0, run.output[-3000:]
    assert run.events()[0]["mesh_shape"] == {"dp_shard": 1, "cp": 2, "tp": 2}
    assert_same_training(run, one_process_run)


def test_lora_under_cp2_matches_a_one_process_run(assets: Assets) -> None:
    peft = {"peft": {"match_all_linear": True, "dim": 8, "alpha": 16}}
    run = launch(assets, "cp2-lora", {**cp_recipe(assets, CP, 4), **peft}, nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    single = launch(
        assets, "cp2-lora-one-process", {**cp_recipe(assets, {"strategy": "fsdp2"}, 4), **peft}
    )
    assert_same_training(run, single)
    assert (run.latest() / "model" / "adapter_model.safetensors").exists()


def test_packed_rows_under_cp2_match_a_one_process_run(assets: Assets) -> None:
    """Packs of several samples: each rank masks other documents over global positions.

    Without validation: packed validation under FSDP2 breaks the next save's state dict
    with or without context parallelism ("Trying to resize storage that is not resizable")."""
    packed = {"packed_sequence": {"enabled": True, "packed_sequence_size": 64}}

    def recipe(distributed: dict) -> dict:
        out = {**cp_recipe(assets, distributed, 2), **packed}
        out["step_scheduler"] = {**out["step_scheduler"], "val_check_interval": 100}
        return out

    run = launch(assets, "cp2-packed", recipe(CP), nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    single = launch(assets, "cp2-packed-one-process", recipe({"strategy": "fsdp2"}))
    assert_same_training(run, single, validations=0)


def test_cp2_checkpoint_loads_in_transformers(cp_run: RunResult, assets: Assets, offline_hub):
    from trainer_harness import transformers_val_loss

    latest = cp_run.latest()
    assert latest.name == f"step_{MAX_STEPS}"
    assert sorted(p.name for p in (latest / "optim").glob("*.distcp")) == [
        f"__{rank}_0.distcp" for rank in range(2)
    ]
    val_loss = transformers_val_loss(latest / "model", assets.val)
    assert val_loss == pytest.approx(cp_run.records("val")[-1]["val_loss"], rel=1e-4)


def test_killed_cp2_run_resumes_with_identical_losses(cp_run: RunResult, assets: Assets) -> None:
    recipe = cp_recipe(assets, CP, 4)
    run_dir = assets.root / "runs" / "cp2-killed"
    killed = launch_until(assets, "cp2-killed", recipe, 2, run_dir, step=5, sig=signal.SIGKILL)
    assert killed.returncode != 0
    assert not any(e["event"] == "finished" for e in killed.events())

    resumed = launch(assets, "cp2-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    start = next(e for e in resumed.events() if e["event"] == "resumed")["step"]
    assert start == 4
    expected, got = by_step(cp_run.records("train")), by_step(resumed.records("train"))
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in range(start + 1, MAX_STEPS + 1):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["grad_norm"] == pytest.approx(expected[step]["grad_norm"], abs=1e-6)
    assert by_step(resumed.records("val"))[MAX_STEPS]["val_loss"] == pytest.approx(
        by_step(cp_run.records("val"))[MAX_STEPS]["val_loss"], abs=1e-6
    )
