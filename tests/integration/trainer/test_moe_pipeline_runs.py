"""Torchrun runs (gloo, FSDP2, float32) of a tiny Qwen3-MoE under pipeline parallelism,
without and with expert parallelism inside the stages, each proven as the other layouts
are: against a one-process run of the same global batch, by its consolidated checkpoint,
and by an exact resume.

The model has 3 decoder layers, layer 1 dense (`mlp_only_layers: [1]`), so stage 0 holds a
sparse and a dense layer and stage 1 a sparse one.

- `pp2`: pp_size 2 on 2 ranks, 4 micro-batches of 2 rows per step (1f1b).
- `pp2-ep2`: pp_size 2 x dp 2 on 4 ranks with ep_size 2: each stage's two ranks spread
  that stage's experts (2 of 4 each); 2 micro-batches of 2 rows per dp rank.

Each layout runs 6 steps (activation checkpointing on, dropout off, a checkpoint and a
validation every 3 steps) and one process runs the same recipe with the whole global batch
of 8 rows per step: losses, gradient norms and validation losses agree to 1e-5 relative
(only reduction orders differ). The step-6 consolidated checkpoint (one file per stage)
holds all 4 experts of both sparse layers as whole tensors under the Hugging Face names,
and equals the one-process run's checkpoint tensor by tensor (to 1e-4 relative, as the
expert-parallel tests hold the saved model to). A run started from the step-3 checkpoint
(`restore_from`) repeats steps 4-6 of the uninterrupted run exactly. LoRA under pp2
trains as a one-process LoRA run does (3 steps).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import Assets, RunResult, comparison_recipe, launch

pytestmark = pytest.mark.slow

STEPS, EVERY, GLOBAL_BATCH, EXPERTS = 6, 3, 8, 4
PIPELINE = {"strategy": "fsdp2", "pp_size": 2, "activation_checkpointing": True}
LAYOUTS = {  # name: (distributed, ranks, batch per dp rank)
    "pp2": ({**PIPELINE, "pipeline": {"pp_microbatch_size": 2}}, 2, 8),
    "pp2-ep2": ({**PIPELINE, "ep_size": 2, "pipeline": {"pp_microbatch_size": 2}}, 4, 4),
}
SPARSE_LAYERS = (0, 2)


def build_tiny_moe(directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from cli.demo_assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, mlp_only_layers=[1], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=EXPERTS, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def moe_model(assets: Assets) -> Path:
    return build_tiny_moe(assets.root / "tiny-qwen3-moe-3-layers")


def moe_recipe(assets: Assets, model: Path, distributed: dict, batch: int) -> dict:
    recipe = comparison_recipe(assets, distributed, batch, STEPS)
    recipe["step_scheduler"].update(
        grad_accumulation_steps=1, val_check_interval=EVERY, checkpoint_interval=EVERY
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    return recipe


@pytest.fixture(scope="module")
def one_process_run(assets: Assets, moe_model: Path) -> RunResult:
    distributed = {"strategy": "fsdp2", "activation_checkpointing": True}
    recipe = moe_recipe(assets, moe_model, distributed, GLOBAL_BATCH)
    run = launch(assets, "moe-pp-one-process", recipe, nproc=1)
    assert run.returncode == 0, run.output[-3000:]
    return run


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_run(request, assets: Assets, moe_model: Path) -> tuple[str, RunResult]:
    name = request.param
    distributed, ranks, batch = LAYOUTS[name]
    run = launch(assets, f"moe-{name}", moe_recipe(assets, moe_model, distributed, batch), ranks)
    assert run.returncode == 0, run.output[-3000:]
    return name, run


def test_layout_trains_like_one_process(layout_run, one_process_run: RunResult) -> None:
    name, run = layout_run
    distributed, ranks, _ = LAYOUTS[name]
    started = run.events()[0]
    assert started["mesh_shape"] == {"pp": 2, "dp_shard": ranks // 2, "tp": 1}
    records, reference = run.records("train"), one_process_run.records("train")
    assert [r["step"] for r in records] == [r["step"] for r in reference] == [1, 2, 3, 4, 5, 6]
    for got, want in zip(records, reference, strict=True):
        assert got["num_tokens"] == want["num_tokens"], got["step"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), got["step"]
    assert records[-1]["loss"] < records[0]["loss"]
    vals = list(zip(run.records("val"), one_process_run.records("val"), strict=True))
    assert [got["step"] for got, _ in vals] == [EVERY, STEPS]
    for got, want in vals:
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5), got["step"]


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for path in model_dir.glob("*.safetensors") for k, v in load_file(path).items()}


def test_layout_checkpoint_holds_every_expert(layout_run, one_process_run: RunResult) -> None:
    _, run = layout_run
    model_dir = run.run_dir / "checkpoints" / f"step_{STEPS}" / "model"
    assert len(list(model_dir.glob("*.safetensors"))) == 2  # one file per stage
    weights = _weights(model_dir)
    reference = _weights(one_process_run.run_dir / "checkpoints" / f"step_{STEPS}" / "model")
    assert sorted(weights) == sorted(reference)
    for layer in SPARSE_LAYERS:
        prefix = f"model.layers.{layer}.mlp"
        for expert in range(EXPERTS):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"{prefix}.experts.{expert}.{proj}.weight" in weights
        assert weights[f"{prefix}.experts.0.up_proj.weight"].shape == (32, 64)
    assert "model.layers.1.mlp.up_proj.weight" in weights  # the dense layer
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def test_layout_resumes_exactly(layout_run, assets: Assets, moe_model: Path) -> None:
    name, run = layout_run
    distributed, ranks, batch = LAYOUTS[name]
    recipe = moe_recipe(assets, moe_model, distributed, batch)
    recipe["restore_from"] = {"path": str(run.run_dir / "checkpoints" / f"step_{EVERY}")}
    resumed = launch(assets, f"moe-{name}-resumed", recipe, nproc=ranks)
    assert resumed.returncode == 0, resumed.output[-3000:]
    events = resumed.events()
    assert any(e["event"] == "resume_verified" and e["step"] == EVERY for e in events), events
    expected = {r["step"]: r for r in run.records("train")}
    got = resumed.records("train")
    assert [r["step"] for r in got] == list(range(EVERY + 1, STEPS + 1))
    for record in got:
        want = expected[record["step"]]
        assert (record["loss"], record["grad_norm"]) == (want["loss"], want["grad_norm"])
    val_want = [r for r in run.records("val") if r["step"] == STEPS]
    val_got = [r for r in resumed.records("val") if r["step"] == STEPS]
    assert val_got[0]["val_loss"] == val_want[0]["val_loss"]


def test_lora_pp2_trains_like_one_process(assets: Assets, moe_model: Path) -> None:
    """LoRA splits through the PEFT model's base on Qwen3-MoE too (adapters on the
    attention and dense-layer linears ride in the stages' layers)."""

    def lora_recipe(distributed: dict, batch: int) -> dict:
        recipe = moe_recipe(assets, moe_model, distributed, batch)
        recipe["step_scheduler"].update(max_steps=EVERY)
        recipe["lr_scheduler"]["warmup_steps"] = 1
        recipe["peft"] = {"match_all_linear": True, "dim": 4, "alpha": 8}
        return recipe

    single = launch(assets, "moe-lora-one-process", lora_recipe({"strategy": "fsdp2"}, 8))
    distributed, ranks, batch = LAYOUTS["pp2"]
    run = launch(assets, "moe-lora-pp2", lora_recipe(distributed, batch), ranks)
    for result in (single, run):
        assert result.returncode == 0, result.output[-3000:]
    records, reference = run.records("train"), single.records("train")
    assert [r["step"] for r in records] == [r["step"] for r in reference] == [1, 2, 3]
    for got, want in zip(records, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), got["step"]
