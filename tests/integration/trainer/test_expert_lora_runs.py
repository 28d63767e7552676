"""LoRA on a tiny Qwen3-MoE's routed experts (AutoModel's `target_modules: ['*']`, with
`moe_rank_scaling`), with expert parallelism, proven as the other layouts are.

`target_modules: ['*']` adapts every linear layer (attention, lm_head) with peft and every
grouped-experts module with per-expert adapters (`models.common.moe.lora`) of rank
dim // experts per token = 2. Layouts, each against one process running the whole global
batch (6 steps, validation and checkpoint every 3, dropout off, fp32):

- `ep2`: ep_size 2 on 2 ranks: each rank keeps two experts and their adapters (ep == dp:
  outside FSDP2, gradients scaled by a hook).
- `ep2-dp4`: ep_size 2 on 4 ranks: ranks r and r + 2 hold the same experts, whose weights
  and adapters FSDP2 shards over the pair.
- `pp2-ep2`: two pipeline stages of one decoder layer each on 4 ranks, each stage's experts
  and adapters spread over its 2 ranks; the LoRA-wrapped lm_head runs on the last stage, and
  the adapter is gathered from both stages into one file.

Losses, gradient norms and validation losses agree to 1e-5 relative. The step-6 adapter
holds one lora_A/lora_B pair per expert projection (peft's per-expert layout, rank 2 in
`rank_pattern`) equal to the one-process adapter; its merged export, loaded by plain
transformers, reproduces the run's validation loss. A run from the step-3 checkpoint
repeats steps 4-6 exactly.
"""

from __future__ import annotations

import json
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

STEPS, EVERY, GLOBAL_BATCH = 6, 3, 8
PEFT = {"target_modules": ["*"], "dim": 4, "alpha": 8, "moe_rank_scaling": True}
LAYOUTS = {"ep2": 2, "ep2-dp4": 4, "pp2-ep2": 4}  # name: ranks


@pytest.fixture(scope="module")
def moe_model(assets: Assets) -> Path:
    return build_tiny_qwen3_moe(assets.root / "tiny-qwen3-moe-lora")


def lora_recipe(assets: Assets, model: Path, distributed: dict, batch: int) -> dict:
    recipe = comparison_recipe(assets, distributed, batch, STEPS)
    recipe["step_scheduler"].update(
        grad_accumulation_steps=1, val_check_interval=EVERY, checkpoint_interval=EVERY
    )
    recipe["model"].update(pretrained_model_name_or_path=str(model), dtype="float32")
    recipe["peft"] = dict(PEFT)
    return recipe


def ep_distributed(name: str = "ep2") -> dict:
    if name.startswith("pp2"):  # one decoder layer per stage, experts over each stage's 2 ranks
        pipeline = {"pp_microbatch_size": 2}
        return {"strategy": "fsdp2", "ep_size": 2, "pp_size": 2, "pipeline": pipeline}
    return {"strategy": "fsdp2", "ep_size": 2, "activation_checkpointing": True}


@pytest.fixture(scope="module")
def one_process(assets: Assets, moe_model: Path) -> RunResult:
    recipe = lora_recipe(assets, moe_model, {"strategy": "fsdp2"}, GLOBAL_BATCH)
    run = launch(assets, "expert-lora-one-process", recipe, nproc=1)
    assert run.returncode == 0, run.output[-3000:]
    return run


_RUNS: dict[str, RunResult] = {}


def layout(assets: Assets, model: Path, name: str) -> RunResult:
    """The layout's uninterrupted run, launched once per session."""
    if name not in _RUNS:
        ranks = LAYOUTS[name]
        dp = ranks // 2 if name.startswith("pp2") else ranks
        recipe = lora_recipe(assets, model, ep_distributed(name), GLOBAL_BATCH // dp)
        _RUNS[name] = launch(assets, f"expert-lora-{name}", recipe, nproc=ranks)
    run = _RUNS[name]
    assert run.returncode == 0, run.output[-3000:]
    return run


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout_run(request, assets: Assets, moe_model: Path) -> tuple[str, RunResult]:
    return request.param, layout(assets, moe_model, request.param)


def test_expert_lora_with_ep_trains_like_one_process(layout_run, one_process) -> None:
    _, run = layout_run
    records, reference = run.records("train"), one_process.records("train")
    assert [r["step"] for r in records] == [r["step"] for r in reference] == list(range(1, 7))
    for got, want in zip(records, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), got["step"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), got["step"]
    assert records[-1]["loss"] < records[0]["loss"]
    for got, want in zip(run.records("val"), one_process.records("val"), strict=True):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5), got["step"]


def test_expert_adapter_is_per_expert_and_merges(
    layout_run, one_process, assets: Assets, offline_hub, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    _, run = layout_run
    ours = run.run_dir / "checkpoints" / f"step_{STEPS}" / "model"
    theirs = one_process.run_dir / "checkpoints" / f"step_{STEPS}" / "model"
    adapter = load_file(ours / "adapter_model.safetensors")
    reference = load_file(theirs / "adapter_model.safetensors")
    assert adapter.keys() == reference.keys()
    for layer in range(2):
        for expert in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                key = f"base_model.model.model.layers.{layer}.mlp.experts.{expert}.{proj}"
                assert adapter[f"{key}.lora_A.weight"].shape[0] == 2  # 4 // 2 experts per token
                assert adapter[f"{key}.lora_B.weight"].abs().sum() > 0  # trained
    for name, tensor in adapter.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-3, atol=1e-4, msg=name)
    config = json.loads((ours / "adapter_config.json").read_text())
    assert list(config["rank_pattern"].values()) == [2] and config["r"] == 4
    merged = _merged_export(run.run_dir / "checkpoints" / f"step_{STEPS}", tmp_path / "merged")
    val = [r["val_loss"] for r in run.records("val") if r["step"] == STEPS]
    assert transformers_val_loss(merged, assets.val) == pytest.approx(val[0], rel=1e-4)


def _merged_export(step_dir: Path, out: Path) -> Path:
    from trainer.export import export_checkpoint

    export_checkpoint(step_dir, out, "merged", "float32")
    return out


def test_expert_lora_with_ep_resumes_exactly(assets: Assets, moe_model: Path) -> None:
    run = layout(assets, moe_model, "ep2")
    recipe = lora_recipe(assets, moe_model, ep_distributed(), GLOBAL_BATCH // 2)
    recipe["restore_from"] = {"path": str(run.run_dir / "checkpoints" / f"step_{EVERY}")}
    resumed = launch(assets, "expert-lora-ep2-resumed", recipe, nproc=2)
    assert_resumed_exactly(run, resumed, EVERY, STEPS)
