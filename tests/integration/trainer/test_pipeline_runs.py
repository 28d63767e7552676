"""Pipeline parallelism under torchrun on gloo: `pp_size: 2` on 2 ranks, `tp 2 x pp 2` and
`pp 2 x dp_shard 2` on 4, an interleaved schedule with two virtual stages per rank, GPipe
and looped BFS, checkpoints and exact resume.

Every run trains the same global batch (4 rows per step, 2 loader batches per step) as a
1-process FSDP2 run of the same recipe, so its per-step losses, gradient norms and
validation losses must equal that run's to 1e-5 relative in float32 (only reduction
orders differ): the last stage's loss is token-normalised exactly as without PP and the
gradient norm adds every stage's squares. The consolidated checkpoint (one safetensors
file per stage under one index) loads in plain transformers with the trainer's validation
loss, and a run killed after a checkpoint resumes with the uninterrupted run's losses.
Attention dropout is off so a 1-rank and a multi-rank run can draw the same numbers.
"""

from __future__ import annotations

import json
import signal

import pytest
from trainer_harness import Assets, RunResult, base_recipe, launch, launch_until

from cli.demo_assets import build_tiny_llama

pytestmark = pytest.mark.slow

MAX_STEPS = 6
PP2 = {"strategy": "fsdp2", "pp_size": 2, "pipeline": {"pp_microbatch_size": 2}}
TP2_PP2 = {**PP2, "tp_size": 2}
INTERLEAVED = {
    "strategy": "fsdp2",
    "pp_size": 2,
    "pipeline": {"pp_schedule": "Interleaved1F1B", "pp_microbatch_size": 1},
}


def pp_recipe(assets: Assets, distributed: dict, model_dir=None, batch_size: int = 4) -> dict:
    model = {"attention_dropout": 0.0}
    if model_dir is not None:
        model["pretrained_model_name_or_path"] = str(model_dir)
    return base_recipe(
        assets,
        distributed=distributed,
        model=model,
        dataloader={"batch_size": batch_size},
        step_scheduler={"max_steps": MAX_STEPS, "val_check_interval": 3, "checkpoint_interval": 3},
        checkpoint={"keep_last": 2},
    )


@pytest.fixture(scope="module")
def four_layer_model(assets: Assets):
    return build_tiny_llama(assets.root / "tiny-llama-4-layers", num_hidden_layers=4)


@pytest.fixture(scope="module")
def four_layer_one_process(assets: Assets, four_layer_model) -> RunResult:
    recipe = pp_recipe(assets, {"strategy": "fsdp2"}, four_layer_model)
    return launch(assets, "pp-one-process-4", recipe)


@pytest.fixture(scope="module")
def one_process_run(assets: Assets) -> RunResult:
    return launch(assets, "pp-one-process", pp_recipe(assets, {"strategy": "fsdp2"}))


@pytest.fixture(scope="module")
def pp2_run(assets: Assets) -> RunResult:
    return launch(assets, "pp2", pp_recipe(assets, PP2), nproc=2)


def by_step(records: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in records}


def assert_same_training(got: RunResult, want: RunResult) -> None:
    assert got.returncode == 0, got.output[-3000:]
    assert want.returncode == 0, want.output[-3000:]
    ours, theirs = got.records("train"), want.records("train")
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == list(range(1, 7))
    for a, b in zip(ours, theirs, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), a["step"]
        assert a["num_tokens"] == b["num_tokens"], a["step"]
    vals = zip(got.records("val"), want.records("val"), strict=True)
    for a, b in vals:
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5), a["step"]
    assert ours[-1]["loss"] < ours[0]["loss"]


def test_pp2_builds_the_pp_mesh_and_matches_one_process(pp2_run, one_process_run) -> None:
    assert pp2_run.returncode == 0, pp2_run.output[-3000:]
    started = pp2_run.events()[0]
    assert started["mesh_shape"] == {"pp": 2, "dp_shard": 1, "tp": 1}
    assert_same_training(pp2_run, one_process_run)


def test_tp2_pp2_on_four_ranks_matches_one_process(assets: Assets, one_process_run) -> None:
    run = launch(assets, "tp2-pp2", pp_recipe(assets, TP2_PP2), nproc=4)
    assert run.returncode == 0, run.output[-3000:]
    assert run.events()[0]["mesh_shape"] == {"pp": 2, "dp_shard": 1, "tp": 2}
    assert_same_training(run, one_process_run)
    _assert_loadable_checkpoint(run, assets, world_size=4)


def test_pp2_with_fsdp2_dp_shard2_on_four_ranks_matches_one_process(assets: Assets) -> None:
    # 4 rows per dp rank x 2 dp ranks: the 1-process run takes 8 rows per loader batch
    run = launch(assets, "pp2-dp2", pp_recipe(assets, PP2), nproc=4)
    assert run.returncode == 0, run.output[-3000:]
    assert run.events()[0]["mesh_shape"] == {"pp": 2, "dp_shard": 2, "tp": 1}
    single = launch(assets, "pp-one-process-8", pp_recipe(assets, {"strategy": "fsdp2"}, None, 8))
    assert_same_training(run, single)


def test_interleaved_virtual_stages_match_one_process(
    assets: Assets, four_layer_model, four_layer_one_process
) -> None:
    # 4 layers, 2 ranks, 2 virtual stages per rank: rank 0 runs layers 0 and 2
    interleaved = launch(
        assets, "pp2-interleaved", pp_recipe(assets, INTERLEAVED, four_layer_model), nproc=2
    )
    single = four_layer_one_process
    assert_same_training(interleaved, single)
    names = _weight_map(interleaved.latest() / "model")
    assert {n for n in names if n.startswith("model.layers.")} == {
        n for n in _weight_map(single.latest() / "model") if n.startswith("model.layers.")
    }


def _weight_map(model_dir) -> dict[str, str]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as handle:
        return dict.fromkeys(handle.keys(), "model.safetensors")


def _assert_loadable_checkpoint(run: RunResult, assets: Assets, world_size: int) -> None:
    from trainer_harness import transformers_val_loss

    latest = run.latest()
    assert latest.name == f"step_{MAX_STEPS}"
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["world_size"] == world_size and len(state["rng"]) == world_size
    weight_map = _weight_map(latest / "model")
    files = sorted(set(weight_map.values()))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert weight_map["model.embed_tokens.weight"] == files[0]  # stage 0 writes first
    assert weight_map["lm_head.weight"] == files[1]
    val_loss = transformers_val_loss(latest / "model", assets.val)
    assert val_loss == pytest.approx(run.records("val")[-1]["val_loss"], rel=1e-4)


def test_pp2_checkpoint_is_one_consolidated_hf_model(
    pp2_run: RunResult, assets: Assets, offline_hub
) -> None:
    assert pp2_run.returncode == 0, pp2_run.output[-3000:]
    _assert_loadable_checkpoint(pp2_run, assets, world_size=2)
    optim = pp2_run.latest() / "optim"
    assert sorted(p.name for p in optim.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_killed_pp2_run_resumes_with_identical_losses(pp2_run: RunResult, assets: Assets) -> None:
    recipe = pp_recipe(assets, PP2)
    run_dir = assets.root / "runs" / "pp2-killed"
    killed = launch_until(assets, "pp2-killed", recipe, 2, run_dir, step=4, sig=signal.SIGKILL)
    assert killed.returncode != 0
    assert not any(e["event"] == "finished" for e in killed.events())
    resumed = launch(assets, "pp2-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    start = next(e for e in resumed.events() if e["event"] == "resumed")["step"]
    assert start == 3
    expected, got = by_step(pp2_run.records("train")), by_step(resumed.records("train"))
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in range(start + 1, MAX_STEPS + 1):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["grad_norm"] == pytest.approx(expected[step]["grad_norm"], abs=1e-6)
        assert got[step]["lr"] == pytest.approx(expected[step]["lr"], rel=1e-12), step
    val_expected, val_got = by_step(pp2_run.records("val")), by_step(resumed.records("val"))
    assert val_got[MAX_STEPS]["val_loss"] == pytest.approx(
        val_expected[MAX_STEPS]["val_loss"], abs=1e-6
    )


@pytest.mark.parametrize(
    "pipeline",
    [{"pp_schedule": "GPipe", "pp_microbatch_size": 4},  # the whole batch as one micro-batch
     {"pp_schedule": "looped_bfs", "layers_per_stage": 1}],  # 4 stages, 2 per rank
    ids=["gpipe", "looped_bfs"],
)  # fmt: skip
def test_other_schedules_match_one_process(
    assets: Assets, four_layer_model, four_layer_one_process, pipeline
) -> None:
    distributed = {"strategy": "fsdp2", "pp_size": 2, "pipeline": pipeline}
    name = f"pp2-{pipeline['pp_schedule']}"
    run = launch(assets, name, pp_recipe(assets, distributed, four_layer_model), nproc=2)
    assert_same_training(run, four_layer_one_process)
