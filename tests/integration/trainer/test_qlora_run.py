"""QLoRA: a recipe with AutoModel's `quantization:` section run by `torchrun -m trainer` on
gloo ranks, through bitsandbytes' CPU backend (the trainer's code path is the CUDA one's).

Every decoder linear layer holds nf4 weights (the head stays whole), PEFT puts its
bitsandbytes LoRA layers over them, and FSDP2 leaves the quantized weights whole on each
rank: a 2-rank run equals the 1-process run of the same batches (loss and adapter gradient
norm to 1e-5 relative), trains, and saves a PEFT adapter (no base weights). 8-bit trains too.
A run started from the 2-rank run's step-4 checkpoint continues with its losses.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from trainer_harness import REPO, Assets, RunResult, comparison_recipe, launch

pytestmark = pytest.mark.slow

pytest.importorskip("bitsandbytes")

MAX_STEPS = 8
LORA = {"match_all_linear": True, "dim": 8, "alpha": 16, "dropout": 0.0}
NF4 = {
    "load_in_4bit": True,
    "bnb_4bit_compute_dtype": "float32",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_quant_storage": "bfloat16",
}


def qlora_recipe(assets: Assets, quantization: dict, strategy: str, ranks: int) -> dict:
    """The same global batch of 4 on any number of ranks, no gradient accumulation."""
    recipe = comparison_recipe(assets, {"strategy": strategy}, 4 // ranks, MAX_STEPS)
    recipe["step_scheduler"]["grad_accumulation_steps"] = 1
    return {
        **recipe,
        "peft": LORA,
        "quantization": quantization,
        "optimizer": {**recipe["optimizer"], "lr": 1.0e-2},
    }


def run(assets: Assets, name: str, recipe: dict[str, Any], nproc: int) -> RunResult:
    return launch(assets, f"qlora-{name}", recipe, nproc=nproc)


@pytest.fixture(scope="module")
def nf4_runs(assets: Assets) -> tuple[RunResult, RunResult]:
    two = run(assets, "nf4-2", qlora_recipe(assets, NF4, "fsdp2", 2), 2)
    one = run(assets, "nf4-1", qlora_recipe(assets, NF4, "fsdp2", 1), 1)
    return two, one


def test_nf4_qlora_on_two_ranks_equals_one_process(nf4_runs) -> None:
    two, one = nf4_runs
    assert two.returncode == 0, two.output[-3000:]
    assert one.returncode == 0, one.output[-3000:]
    assert "linear layers hold 4-bit weights (nf4, bitsandbytes)" in two.output
    got, want = two.records("train"), one.records("train")
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, MAX_STEPS + 1))
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-5), g["step"]
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5), g["step"]
    assert got[-1]["loss"] < got[0]["loss"]


def test_qlora_saves_a_peft_adapter_only(nf4_runs) -> None:
    two, _ = nf4_runs
    model_dir = two.latest() / "model"
    tensors = load_file(model_dir / "adapter_model.safetensors")
    assert tensors and all("lora_" in name for name in tensors)
    assert any("q_proj.lora_A" in name for name in tensors)
    assert not (model_dir / "model.safetensors").exists()


def test_the_merged_export_folds_the_adapter_into_the_unquantized_base(
    assets: Assets, nf4_runs, tmp_path
) -> None:
    two, _ = nf4_runs
    out = tmp_path / "merged"
    command = [sys.executable, "-m", "trainer.export", "--checkpoint", str(two.latest())]
    command += ["--out", str(out), "--kind", "merged", "--dtype", "float32"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    merged = load_file(out / "model.safetensors")
    base = load_file(assets.model / "model.safetensors")
    assert sorted(merged) == sorted(base)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert merged[name].dtype == torch.float32 and not torch.equal(merged[name], base[name])
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])


def test_qlora_resumes_with_the_uninterrupted_losses(assets: Assets, nf4_runs) -> None:
    two, _ = nf4_runs
    recipe = qlora_recipe(assets, NF4, "fsdp2", 2)
    recipe["restore_from"] = {"path": str(two.run_dir / "checkpoints" / "step_4")}
    resumed = run(assets, "nf4-resumed", recipe, 2)
    assert resumed.returncode == 0, resumed.output[-3000:]
    got = {r["step"]: r["loss"] for r in resumed.records("train")}
    want = {r["step"]: r["loss"] for r in two.records("train")}
    assert sorted(got) == list(range(5, MAX_STEPS + 1))
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=1e-5), step


def test_int8_qlora_trains(assets: Assets) -> None:
    int8 = run(assets, "int8", qlora_recipe(assets, {"load_in_8bit": True}, "ddp", 2), 2)
    assert int8.returncode == 0, int8.output[-3000:]
    assert "linear layers hold 8-bit weights (int8, bitsandbytes)" in int8.output
    losses = [r["loss"] for r in int8.records("train")]
    assert len(losses) == MAX_STEPS and losses[-1] < losses[0]
