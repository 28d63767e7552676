"""Torchrun runs (gloo, FSDP2) of a tiny Qwen3-MoE in the expert-parallel layouts beyond
fp32 with ep == dp, each proven as the other layouts are: against a one-process run of the
same global batch, by its consolidated checkpoint, and by an exact resume.

- `ep2-bf16`: ep_size 2 on 2 ranks with the model in bf16 (the router kept fp32, an FSDP2
  group of its own).
- `ep2-dp4`: ep_size 2 on 4 ranks in fp32: ranks (0, 1) and (2, 3) each spread the experts,
  and ranks r and r + 2 hold the same experts, FSDP2-sharded over the pair.
- `ep2-cp2`: ep_size 2 and cp_size 2 on 2 ranks in fp32: the two context-parallel ranks
  (each with half of every row's tokens) are the expert-parallel peers.
- `ep2-dp2-cp2`: ep_size 2 with dp 2 x cp 2 on 4 ranks in fp32: experts spread over pairs
  of the dp x cp ranks and FSDP2-sharded over the ranks that hold the same ones.

Each layout runs 6 steps (activation checkpointing on, dropout off, a checkpoint and a
validation every 3 steps) and one process runs the same recipe with the whole global batch
per step. fp32 losses, gradient norms and validation losses agree to 1e-5 relative (only
the reduction order differs). bf16 ones to 2^-7 relative, one bf16 ulp at most: the ranks
sum partial bf16 gradients in another order than one process does, each such sum rounds
to bf16's 8 significant bits, and the gradient norm is itself a bf16 norm per mesh group,
so it may land one ulp apart. (Measured: at most about 2e-3, on the gradient norm.) The
step-6 checkpoint holds all 4 experts of each layer in the run's dtypes (the router fp32),
and plain transformers reproduces the run's validation loss from it (to 1e-4 in fp32; to
2^-7 in bf16, transformers computing in fp32 from the same bf16 weights).
A run started from the step-3 checkpoint (`restore_from`) passes the resume fingerprint
check and repeats steps 4-6 of the uninterrupted run exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_expert_parallel_run import build_tiny_qwen3_moe
from trainer_harness import (
    Assets,
    RunResult,
    assert_resumed_exactly,
    comparison_recipe,
    launch,
    transformers_val_loss,
)

pytestmark = pytest.mark.slow

STEPS, EVERY = 6, 3
BF16_ULP = 2.0**-7  # the largest relative step between two bf16 values
LAYOUTS = {  # name: (model dtype, ranks, batch per dp rank, tolerance vs one process, cp_size)
    "ep2-bf16": ("bfloat16", 2, 4, BF16_ULP, 1),
    "ep2-dp4": ("float32", 4, 2, 1e-5, 1),
    "ep2-cp2": ("float32", 2, 8, 1e-5, 2),
    "ep2-dp2-cp2": ("float32", 4, 4, 1e-5, 2),
}
GLOBAL_BATCH = 8
DISTRIBUTED = {"strategy": "fsdp2", "ep_size": 2, "activation_checkpointing": True}


@pytest.fixture(scope="module")
def moe_model(assets: Assets) -> Path:
    return build_tiny_qwen3_moe(assets.root / "tiny-qwen3-moe")


def moe_recipe(assets: Assets, model: Path, dtype: str, distributed: dict, batch: int) -> dict:
    recipe = comparison_recipe(assets, distributed, batch, STEPS)
    recipe["step_scheduler"].update(
        grad_accumulation_steps=1, val_check_interval=EVERY, checkpoint_interval=EVERY
    )
    recipe["model"].update(pretrained_model_name_or_path=str(model), dtype=dtype)
    return recipe


def layout_distributed(cp: int) -> dict:
    return {**DISTRIBUTED, "cp_size": cp} if cp > 1 else DISTRIBUTED


@pytest.fixture(scope="module")
def one_process_runs(assets: Assets, moe_model: Path) -> dict[str, RunResult]:
    """The one-process run of the global batch, per dtype: every layout of that dtype
    trains the same recipe, so one reference run serves them all."""
    runs: dict[str, RunResult] = {}
    for dtype in sorted({layout[0] for layout in LAYOUTS.values()}):
        recipe = moe_recipe(assets, moe_model, dtype, {"strategy": "fsdp2"}, GLOBAL_BATCH)
        runs[dtype] = launch(assets, f"{dtype}-one-process", recipe, nproc=1)
    return runs


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_runs(
    request, assets: Assets, moe_model: Path, one_process_runs: dict[str, RunResult]
) -> tuple[str, RunResult, RunResult]:
    """(layout name, its uninterrupted run, the one-process run of the same global batch)."""
    name = request.param
    dtype, ranks, batch, _, cp = LAYOUTS[name]
    recipe = moe_recipe(assets, moe_model, dtype, layout_distributed(cp), batch)
    run = launch(assets, name, recipe, nproc=ranks)
    single = one_process_runs[dtype]
    for result in (run, single):
        assert result.returncode == 0, result.output[-3000:]
    return name, run, single


def test_layout_trains_like_one_process(layout_runs) -> None:
    name, run, single = layout_runs
    tolerance = LAYOUTS[name][3]
    records, reference = run.records("train"), single.records("train")
    assert [r["step"] for r in records] == [r["step"] for r in reference] == [1, 2, 3, 4, 5, 6]
    assert run.events()[0]["dp_size"] == LAYOUTS[name][1] // LAYOUTS[name][4]
    for got, want in zip(records, reference, strict=True):
        assert got["num_tokens"] == want["num_tokens"], got["step"]
        assert got["loss"] == pytest.approx(want["loss"], rel=tolerance), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=tolerance), got["step"]
    assert records[-1]["loss"] < records[0]["loss"]
    for got, want in zip(run.records("val"), single.records("val"), strict=True):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=tolerance), got["step"]


def test_layout_checkpoint_is_the_whole_model(layout_runs, assets: Assets, offline_hub) -> None:
    from safetensors.torch import load_file

    name, run, _ = layout_runs
    model_dir = run.run_dir / "checkpoints" / f"step_{STEPS}" / "model"
    weights = {k: v for path in model_dir.glob("*.safetensors") for k, v in load_file(path).items()}
    dtype = getattr(torch, LAYOUTS[name][0])
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp"
        for expert in range(4):
            assert weights[f"{prefix}.experts.{expert}.up_proj.weight"].dtype == dtype
        assert weights[f"{prefix}.gate.weight"].dtype == torch.float32  # kept fp32
    val = [r for r in run.records("val") if r["step"] == STEPS]
    tolerance = 1e-4 if dtype == torch.float32 else BF16_ULP
    assert val and transformers_val_loss(model_dir, assets.val) == pytest.approx(
        val[0]["val_loss"], rel=tolerance
    )


def test_layout_resumes_exactly(layout_runs, assets: Assets, moe_model: Path) -> None:
    name, run, _ = layout_runs
    dtype, ranks, batch, _, cp = LAYOUTS[name]
    recipe = moe_recipe(assets, moe_model, dtype, layout_distributed(cp), batch)
    recipe["restore_from"] = {"path": str(run.run_dir / "checkpoints" / f"step_{EVERY}")}
    resumed = launch(assets, f"{name}-resumed", recipe, nproc=ranks)
    assert_resumed_exactly(run, resumed, EVERY, STEPS)
