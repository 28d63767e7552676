"""A two-rank torchrun run (gloo, FSDP2) of a tiny gpt-oss with `distributed.ep_size: 2`.

Each rank holds half of every layer's biased experts (activation checkpointing on, so the
expert-parallel collectives also run in the recomputed forward); the attention sinks,
the fp32 router and the alternating sliding/full layers run as in a real checkpoint. The
run trains 10 steps (loss falls) and saves a checkpoint whose consolidated model is
transformers' layout (the grouped expert projections transposed back by the state-dict
adapter): plain transformers loads it and reproduces the trainer's validation loss. A
second launch resumes from that checkpoint and trains on to step 14. The model is the
shipped example's (examples/llm_finetune/build_tiny_gpt_oss.py).
"""

from __future__ import annotations

import pytest
from trainer_harness import Assets, RunResult, base_recipe, launch, transformers_val_loss

from examples.llm_finetune.build_tiny_gpt_oss import build_tiny_gpt_oss

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ep_runs(assets: Assets) -> tuple[RunResult, RunResult]:
    model = build_tiny_gpt_oss(assets.root / "tiny-gpt-oss")
    recipe = base_recipe(
        assets,
        distributed={"strategy": "fsdp2", "ep_size": 2, "activation_checkpointing": True},
        step_scheduler={"max_steps": 10, "grad_accumulation_steps": 1},
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    first = launch(assets, "gpt-oss-ep2", recipe, nproc=2)
    resumed_recipe = {**recipe, "step_scheduler": {**recipe["step_scheduler"], "max_steps": 14}}
    resumed = launch(assets, "gpt-oss-ep2-resume", resumed_recipe, nproc=2, run_dir=first.run_dir)
    return first, resumed


def test_gpt_oss_ep_run_trains_and_loss_falls(ep_runs) -> None:
    first, _ = ep_runs
    assert first.returncode == 0, first.output[-3000:]
    losses = [r["loss"] for r in first.records("train")][:10]
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses


def test_gpt_oss_ep_checkpoint_is_the_full_model_for_transformers(ep_runs, assets) -> None:
    from safetensors import safe_open

    first, _ = ep_runs
    model_dir = first.run_dir / "checkpoints" / "step_10" / "model"
    [shard] = model_dir.glob("*.safetensors")
    with safe_open(shard, "pt") as f:
        assert f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape() == [4, 64, 128]
    val = [r for r in first.records("val") if r["step"] == 10]
    assert val and transformers_val_loss(model_dir, assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )


def test_gpt_oss_ep_run_resumes_from_its_checkpoint(ep_runs) -> None:
    _, resumed = ep_runs
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert any(e["event"] == "resumed" and e["step"] == 10 for e in resumed.events())
    assert [r["step"] for r in resumed.records("train")] == list(range(1, 15))
