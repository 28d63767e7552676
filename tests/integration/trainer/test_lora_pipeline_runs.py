"""LoRA under pipeline parallelism on 2 gloo ranks: the same numbers as a 1-process LoRA
run, one PEFT adapter from both stages, and an exact resume.

Both runs apply the adapters to the whole model before any split (the same seed draws the
same initial adapters), so per-step losses, gradient norms and validation losses must
agree to 1e-5 relative; the checkpoint is one adapter directory holding every layer's
adapters that `AutoPeftModelForCausalLM` loads with the trainer's validation loss.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch
from test_pipeline_runs import MAX_STEPS, PP2, assert_same_training, by_step, pp_recipe
from trainer_harness import Assets, RunResult, launch, launch_until

pytestmark = pytest.mark.slow

LORA = {"match_all_linear": True, "dim": 4, "alpha": 8}


def lora_recipe(assets: Assets, distributed: dict) -> dict:
    recipe = pp_recipe(assets, distributed)
    recipe["peft"] = dict(LORA)
    recipe["optimizer"] = {**recipe.get("optimizer", {}), "lr": 1.0e-2}
    return recipe


@pytest.fixture(scope="module")
def lora_one_process(assets: Assets) -> RunResult:
    return launch(assets, "lora-pp-one-process", lora_recipe(assets, {"strategy": "fsdp2"}))


@pytest.fixture(scope="module")
def lora_pp2(assets: Assets) -> RunResult:
    return launch(assets, "lora-pp2", lora_recipe(assets, PP2), nproc=2)


def adapter_keys(model_dir) -> set[str]:
    from safetensors import safe_open

    with safe_open(model_dir / "adapter_model.safetensors", "pt") as handle:
        return set(handle.keys())


def test_lora_pp2_matches_one_process(lora_pp2: RunResult, lora_one_process: RunResult) -> None:
    assert lora_pp2.returncode == 0, lora_pp2.output[-3000:]
    assert lora_pp2.events()[0]["mesh_shape"] == {"pp": 2, "dp_shard": 1, "tp": 1}
    assert_same_training(lora_pp2, lora_one_process)


def test_lora_pp2_checkpoint_is_one_adapter_of_every_stage(
    lora_pp2: RunResult, lora_one_process: RunResult, assets: Assets, offline_hub
) -> None:
    from safetensors.torch import load_file
    from trainer_harness import transformers_val_loss

    assert lora_pp2.returncode == 0, lora_pp2.output[-3000:]
    ours, theirs = lora_pp2.latest() / "model", lora_one_process.latest() / "model"
    assert not (ours / "model.safetensors").exists()
    keys = adapter_keys(ours)
    assert keys == adapter_keys(theirs)
    layers = {k.split(".layers.")[1].split(".")[0] for k in keys if ".layers." in k}
    assert layers == {"0", "1"}  # both stages' adapters, in one file
    got, want = (
        load_file(ours / "adapter_model.safetensors"),
        load_file(theirs / "adapter_model.safetensors"),
    )
    for key in keys:
        # Adam turns reduction-order differences of near-zero gradients into ~1e-5 steps
        torch.testing.assert_close(got[key], want[key], rtol=1e-3, atol=1e-4)
    val_loss = transformers_val_loss(ours, assets.val)  # transformers loads base + adapter
    assert val_loss == pytest.approx(lora_pp2.records("val")[-1]["val_loss"], rel=1e-4)


def test_killed_lora_pp2_run_resumes_with_identical_losses(
    lora_pp2: RunResult, assets: Assets
) -> None:
    recipe = lora_recipe(assets, PP2)
    run_dir = assets.root / "runs" / "lora-pp2-killed"
    killed = launch_until(assets, "lora-pp2-killed", recipe, 2, run_dir, step=4, sig=signal.SIGKILL)
    assert killed.returncode != 0
    resumed = launch(assets, "lora-pp2-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    start = next(e for e in resumed.events() if e["event"] == "resumed")["step"]
    assert start == 3
    expected, got = by_step(lora_pp2.records("train")), by_step(resumed.records("train"))
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in range(start + 1, MAX_STEPS + 1):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["grad_norm"] == pytest.approx(expected[step]["grad_norm"], abs=1e-6)


def test_lora_pp2_on_a_from_config_model_saves_its_base_from_both_stages(
    assets: Assets, offline_hub
) -> None:
    from trainer_harness import transformers_val_loss

    recipe = lora_recipe(assets, PP2)
    recipe["model"] = {
        "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config",
        "config": str(assets.model),
        "dtype": "float32",
        "attention_dropout": 0.0,
    }
    run = launch(assets, "lora-pp2-from-config", recipe, nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    base = run.latest() / "base_model"
    index = json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.embed_tokens.weight" in index and "lm_head.weight" in index
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"} <= set(
        index
    )
    assert not any("lora_" in name for name in index)
    val_loss = transformers_val_loss(run.latest() / "model", assets.val)
    assert val_loss == pytest.approx(run.records("val")[-1]["val_loss"], rel=1e-4)
