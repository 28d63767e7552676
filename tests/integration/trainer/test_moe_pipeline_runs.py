"""Torchrun runs (gloo, FSDP2, float32) of tiny MoE models under pipeline parallelism,
without and with expert parallelism inside the stages, each proven as the other layouts
are: against a one-process run of the same global batch, by its consolidated checkpoint,
and by an exact resume. Every test runs for each family of `FAMILIES`:

- `qwen3_moe`: 3 decoder layers, layer 1 dense (`mlp_only_layers: [1]`), 4 experts, so
  stage 0 holds a sparse and a dense layer and stage 1 a sparse one.
- `deepseek_v3`: 4 latent-attention layers, layer 0 dense (`first_k_dense_replace: 1`),
  8 routed experts in 4 groups plus a shared expert, router weights and correction biases
  seeded so both steer the routing; under 1f1b stage 0 holds the dense and a sparse layer,
  stage 1 two sparse ones. Nothing crosses layers: tuneyard computes no router aux loss
  (`aux_loss_alpha`, `seq_aux` are not read, as in transformers) and never updates the
  correction bias.

Layouts (a family runs those its `layouts` name; the others are skipped):
- `pp2`: pp_size 2 on 2 ranks, 4 micro-batches of 2 rows per step (1f1b).
- `pp2-ep2`: pp_size 2 x dp 2 on 4 ranks with ep_size 2: each stage's two ranks spread
  that stage's experts (half of them each); 2 micro-batches of 2 rows per dp rank.
- `pp2-tp2` (DeepSeek-V3; Qwen3-MoE has no TP plan): pp_size 2 x tp 2 on 4 ranks, each
  stage's latent attention and dense / shared-expert MLPs split over its two tp ranks
  (routed experts replicated); 4 micro-batches of 2 rows.
- `pp2-interleaved-ep2` (DeepSeek-V3, whose 4 layers fill 4 virtual stages; AutoModel's
  DeepSeek-V3 recipes run EP under interleaved1f1b): 2 one-layer virtual stages per pp
  rank, each spreading its experts over the rank's dp 2 ranks, as `pp2-ep2`.

Each layout runs 6 steps (activation checkpointing on, dropout off, a checkpoint and a
validation every 3 steps) and one process runs the same recipe with the whole global batch
of 8 rows per step: losses, gradient norms and validation losses agree to 1e-5 relative
(only reduction orders differ). The step-6 consolidated checkpoint (one file per pp rank)
holds every expert of every sparse layer as whole tensors under the Hugging Face names,
and equals the one-process run's checkpoint tensor by tensor (to 1e-4 relative, as the
expert-parallel tests hold the saved model to; 2e-5 absolute under TP). A run started from
the step-3 checkpoint (`restore_from`) repeats steps 4-6 of the uninterrupted run exactly.
LoRA under pp2 trains as a one-process LoRA run does (3 steps; for DeepSeek-V3
`match_all_linear` also adapts the router weight and the routed experts' down_proj, as
peft maps deepseek_v3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_deepseek_v3_runs import build_tiny_deepseek_v3
from trainer_harness import Assets, RunResult, assert_resumed_exactly, comparison_recipe, launch

pytestmark = pytest.mark.slow

STEPS, EVERY, GLOBAL_BATCH = 6, 3, 8
PIPELINE = {"strategy": "fsdp2", "pp_size": 2, "activation_checkpointing": True}
LAYOUTS = {  # name: (distributed, ranks, batch per dp rank)
    "pp2": ({**PIPELINE, "pipeline": {"pp_microbatch_size": 2}}, 2, 8),
    "pp2-ep2": ({**PIPELINE, "ep_size": 2, "pipeline": {"pp_microbatch_size": 2}}, 4, 4),
    "pp2-tp2": ({**PIPELINE, "tp_size": 2, "pipeline": {"pp_microbatch_size": 2}}, 4, 8),
    "pp2-interleaved-ep2": (
        {
            **PIPELINE,
            "ep_size": 2,
            "pipeline": {"pp_schedule": "interleaved1f1b", "pp_microbatch_size": 2},
        },
        4,
        4,
    ),
}


def build_tiny_moe(directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from cli.demo_assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, mlp_only_layers=[1], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


@dataclass(frozen=True)
class Family:
    """A tiny MoE checkpoint, where its experts are, and the layouts it runs."""

    build: Callable[[Path], Path]
    experts: int
    sparse_layers: tuple[int, ...]
    dense_layer: int
    layouts: tuple[str, ...] = ("pp2", "pp2-ep2")  # Qwen3-MoE: no TP plan, 3 layers


FAMILIES = {
    "qwen3_moe": Family(build_tiny_moe, experts=4, sparse_layers=(0, 2), dense_layer=1),
    "deepseek_v3": Family(
        lambda d: build_tiny_deepseek_v3(d, num_hidden_layers=4),
        experts=8,
        sparse_layers=(1, 2, 3),
        dense_layer=0,
        layouts=tuple(LAYOUTS),
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def moe_model(assets: Assets, family: str) -> Path:
    return FAMILIES[family].build(assets.root / f"tiny-{family}-pp")


def moe_recipe(assets: Assets, model: Path, distributed: dict, batch: int) -> dict:
    recipe = comparison_recipe(assets, distributed, batch, STEPS)
    recipe["step_scheduler"].update(
        grad_accumulation_steps=1, val_check_interval=EVERY, checkpoint_interval=EVERY
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    return recipe


@pytest.fixture(scope="module")
def one_process_run(assets: Assets, family: str, moe_model: Path) -> RunResult:
    distributed = {"strategy": "fsdp2", "activation_checkpointing": True}
    recipe = moe_recipe(assets, moe_model, distributed, GLOBAL_BATCH)
    run = launch(assets, f"{family}-pp-one-process", recipe, nproc=1)
    assert run.returncode == 0, run.output[-3000:]
    return run


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_run(request, assets: Assets, family: str, moe_model: Path) -> tuple[str, RunResult]:
    name = request.param
    if name not in FAMILIES[family].layouts:
        pytest.skip(f"{family} runs {', '.join(FAMILIES[family].layouts)} here, not {name}")
    distributed, ranks, batch = LAYOUTS[name]
    recipe = moe_recipe(assets, moe_model, distributed, batch)
    run = launch(assets, f"{family}-{name}", recipe, ranks)
    assert run.returncode == 0, run.output[-3000:]
    return name, run


def test_layout_trains_like_one_process(layout_run, one_process_run: RunResult) -> None:
    name, run = layout_run
    distributed, ranks, _ = LAYOUTS[name]
    started, tp = run.events()[0], distributed.get("tp_size", 1)
    assert started["mesh_shape"] == {"pp": 2, "dp_shard": ranks // 2 // tp, "tp": tp}
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


def test_layout_checkpoint_holds_every_expert(
    layout_run, one_process_run: RunResult, family: str
) -> None:
    name, run = layout_run
    moe = FAMILIES[family]
    model_dir = run.run_dir / "checkpoints" / f"step_{STEPS}" / "model"
    assert len(list(model_dir.glob("*.safetensors"))) == 2  # one file per pp rank
    weights = _weights(model_dir)
    reference = _weights(one_process_run.run_dir / "checkpoints" / f"step_{STEPS}" / "model")
    assert sorted(weights) == sorted(reference)
    for layer in moe.sparse_layers:
        prefix = f"model.layers.{layer}.mlp"
        for expert in range(moe.experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"{prefix}.experts.{expert}.{proj}.weight" in weights
        assert weights[f"{prefix}.experts.0.up_proj.weight"].shape == (32, 64)
    assert f"model.layers.{moe.dense_layer}.mlp.up_proj.weight" in weights
    # Adam turns reduction-order differences of near-zero gradients into steps of ~1e-5
    # (measured up to 7.8e-6 under TP); the dense layouts' weight checks hold 1e-4 too.
    for key, tensor in reference.items():
        torch.testing.assert_close(weights[key], tensor, rtol=1e-4, atol=1e-4, msg=key)


def test_layout_resumes_exactly(layout_run, assets: Assets, family: str, moe_model: Path) -> None:
    name, run = layout_run
    distributed, ranks, batch = LAYOUTS[name]
    recipe = moe_recipe(assets, moe_model, distributed, batch)
    recipe["restore_from"] = {"path": str(run.run_dir / "checkpoints" / f"step_{EVERY}")}
    resumed = launch(assets, f"{family}-{name}-resumed", recipe, nproc=ranks)
    assert_resumed_exactly(run, resumed, EVERY, STEPS)


def test_lora_pp2_trains_like_one_process(assets: Assets, family: str, moe_model: Path) -> None:
    """LoRA splits through the PEFT model's base on MoE models too (adapters on the
    attention and dense-layer linears, and for DeepSeek-V3 peft's router and routed
    down_proj ones, ride in the stages' layers)."""

    def lora_recipe(distributed: dict, batch: int) -> dict:
        recipe = moe_recipe(assets, moe_model, distributed, batch)
        recipe["step_scheduler"].update(max_steps=EVERY)
        recipe["lr_scheduler"]["warmup_steps"] = 1
        recipe["peft"] = {"match_all_linear": True, "dim": 4, "alpha": 8}
        return recipe

    single = launch(assets, f"{family}-lora-one-process", lora_recipe({"strategy": "fsdp2"}, 8))
    distributed, ranks, batch = LAYOUTS["pp2"]
    run = launch(assets, f"{family}-lora-pp2", lora_recipe(distributed, batch), ranks)
    for result in (single, run):
        assert result.returncode == 0, result.output[-3000:]
    records, reference = run.records("train"), single.records("train")
    assert [r["step"] for r in records] == [r["step"] for r in reference] == [1, 2, 3]
    for got, want in zip(records, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), got["step"]
