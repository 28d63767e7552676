"""LoRA under tensor parallelism: tp 2 (with and without sequence parallelism) on 2 gloo
ranks and tp 2 x dp 2 on 4, each against a 1-process LoRA run of the same global batch.

The tiny Llama is wrapped by PEFT first, then the dense plan shards each projection's base
layer and places its adapters beside it (colwise q/k/v/gate/up: lora_B colwise; rowwise
o/down: lora_A rowwise). The run's losses and adapter gradient norms equal the 1-process
run's (same global batch, dropout off) to 1e-5 relative, float32; its saved adapter holds
the whole (gathered) tensors under PEFT's names and equals the 1-process adapter (to 1e-4:
Adam's first steps magnify reduction-order differences of near-zero gradients); and a run
killed after a checkpoint resumes with later losses equal to the uninterrupted run's.
"""

from __future__ import annotations

import signal

import pytest
import torch
from safetensors.torch import load_file
from trainer_harness import Assets, RunResult, comparison_recipe, launch, launch_until

pytestmark = pytest.mark.slow

MAX_STEPS = 6
LORA = {"match_all_linear": True, "dim": 8, "alpha": 16, "dropout": 0.0}
TP2 = {"strategy": "fsdp2", "tp_size": 2}
TP2_SP = {**TP2, "sequence_parallel": True}
# layout -> (distributed, ranks); the 1-process run reads the same global batch (4 per dp rank)
LAYOUTS = {"tp2": (TP2, 2), "tp2-sp": (TP2_SP, 2), "tp2-dp2": (TP2, 4)}


def lora_recipe(assets: Assets, distributed: dict, batch_size: int = 4) -> dict:
    recipe = comparison_recipe(assets, distributed, batch_size, MAX_STEPS)
    recipe["step_scheduler"] = {**recipe["step_scheduler"], "checkpoint_interval": 3}
    return {**recipe, "peft": LORA, "optimizer": {**recipe["optimizer"], "lr": 1.0e-2}}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def tp_run(request: pytest.FixtureRequest, assets: Assets) -> RunResult:
    distributed, nproc = LAYOUTS[request.param]
    return launch(assets, f"lora-{request.param}", lora_recipe(assets, distributed), nproc=nproc)


@pytest.fixture
def one_process_run(assets: Assets, tp_run: RunResult) -> RunResult:
    """The 1-process LoRA run with the tp run's global batch (launched once per size)."""
    dp = 2 if tp_run.run_dir.name.endswith("dp2") else 1
    run_dir = assets.root / "runs" / f"lora-one-process-{dp}"
    if (run_dir / "checkpoints" / "LATEST").exists():
        return RunResult(run_dir, 0, "")
    recipe = lora_recipe(assets, {"strategy": "fsdp2"}, batch_size=4 * dp)
    return launch(assets, f"lora-one-process-{dp}", recipe, nproc=1)


def adapter(run: RunResult) -> dict[str, torch.Tensor]:
    return load_file(run.latest() / "model" / "adapter_model.safetensors")


def test_lora_tp_matches_a_one_process_run(tp_run: RunResult, one_process_run: RunResult) -> None:
    assert tp_run.returncode == 0, tp_run.output[-3000:]
    assert one_process_run.returncode == 0, one_process_run.output[-3000:]
    started = tp_run.events()[0]
    assert started["mesh_shape"]["tp"] == 2
    got, want = tp_run.records("train"), one_process_run.records("train")
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, MAX_STEPS + 1))
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-5), g["step"]
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5), g["step"]
    assert got[-1]["loss"] < got[0]["loss"]


def test_lora_tp_saves_the_whole_adapter_of_the_one_process_run(
    tp_run: RunResult, one_process_run: RunResult
) -> None:
    got, want = adapter(tp_run), adapter(one_process_run)
    assert sorted(got) == sorted(want) and any("lora_B" in name for name in got)
    for name, tensor in want.items():
        assert got[name].shape == tensor.shape, name
        # Adam turns reduction-order differences of near-zero gradients into ~1e-5 steps
        torch.testing.assert_close(got[name], tensor, rtol=1e-3, atol=1e-4, msg=name)
    assert not (tp_run.latest() / "model" / "model.safetensors").exists()


def test_killed_lora_tp_run_resumes_with_identical_losses(
    assets: Assets, tp_run: RunResult
) -> None:
    if tp_run.run_dir.name != "lora-tp2":
        pytest.skip("resume is proven once, on the plain tp run")
    recipe = lora_recipe(assets, TP2)
    run_dir = assets.root / "runs" / "lora-tp2-killed"
    killed = launch_until(assets, "lora-tp2-killed", recipe, 2, run_dir, step=4, sig=signal.SIGKILL)
    assert killed.returncode != 0
    resumed = launch(assets, "lora-tp2-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    start = next(e for e in resumed.events() if e["event"] == "resumed")["step"]
    assert start == 3
    expected = {r["step"]: r for r in tp_run.records("train")}
    got = {r["step"]: r for r in resumed.records("train")}
    for step in range(start + 1, MAX_STEPS + 1):
        assert got[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-6), step
        assert got[step]["grad_norm"] == pytest.approx(expected[step]["grad_norm"], abs=1e-6)
    for name, tensor in adapter(tp_run).items():
        torch.testing.assert_close(adapter(resumed)[name], tensor, rtol=0, atol=1e-6, msg=name)
