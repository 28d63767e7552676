"""Torchrun runs (gloo) of a tiny DeepSeek-V3: the registry row's EP, TP and LoRA claims end to end.

One checkpoint (router weights and correction biases seeded so both steer the routing)
feeds three recipes. `ep_size: 2` on 2 ranks (FSDP2, activation checkpointing): the loss
falls, the consolidated checkpoint holds all experts and the untouched correction bias and
reproduces the validation loss in plain transformers, and a second launch resumes from it.
`tp_size: 2` with sequence parallelism trains to the same losses and weights as a
one-process run of the same recipe. LoRA (all linear layers) trains, checkpoints its
adapter and resumes from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import Assets, RunResult, base_recipe, launch, transformers_val_loss

pytestmark = pytest.mark.slow

BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"


def build_tiny_deepseek_v3(directory: Path, **overrides) -> Path:
    import sys

    import transformers

    from cli.demo_assets import build_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "models"))
    from _deepseek_v3_worker import seed_routers, tiny_config

    build_tokenizer(directory, vocab_size=512)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(vocab_size=512, **overrides))
    seed_routers(model)
    model.save_pretrained(directory)
    return directory


def _recipe(assets: Assets, model: Path, steps: int, **sections) -> dict:
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": steps, "grad_accumulation_steps": 1,
                        "val_check_interval": steps, "checkpoint_interval": steps},
        **sections,
    )  # fmt: skip
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    return recipe


@pytest.fixture(scope="module")
def model_dir(assets: Assets) -> Path:
    return build_tiny_deepseek_v3(assets.root / "tiny-deepseek-v3")


def _weights(run: RunResult, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in (run.run_dir / "checkpoints" / f"step_{step}" / "model").glob("*.safetensors"):
        weights.update(load_file(path))
    return weights


def _ok(*runs: RunResult) -> None:
    for run in runs:
        assert run.returncode == 0, run.output[-3000:]


def test_ep_run_trains_checkpoints_all_experts_and_resumes(assets, model_dir) -> None:
    from safetensors.torch import load_file

    distributed = {"strategy": "fsdp2", "ep_size": 2, "activation_checkpointing": True}
    recipe = _recipe(assets, model_dir, 10, distributed=distributed)
    first = launch(assets, "ds-ep2", recipe, nproc=2)
    _ok(first)
    losses = [r["loss"] for r in first.records("train")]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    weights = _weights(first, 10)
    assert {f"model.layers.1.mlp.experts.{e}.up_proj.weight" for e in range(8)} <= set(weights)
    assert torch.equal(weights[BIAS], load_file(model_dir / "model.safetensors")[BIAS])
    val = [r for r in first.records("val") if r["step"] == 10]
    model = first.run_dir / "checkpoints" / "step_10" / "model"
    assert val and transformers_val_loss(model, assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )
    more = {**recipe, "step_scheduler": {**recipe["step_scheduler"], "max_steps": 12}}
    resumed = launch(assets, "ds-ep2-resume", more, nproc=2, run_dir=first.run_dir)
    _ok(resumed)
    assert any(e["event"] == "resumed" and e["step"] == 10 for e in resumed.events())
    assert [r["step"] for r in resumed.records("train")] == list(range(1, 13))


def test_tp_run_trains_like_one_process(assets, model_dir) -> None:
    tp2 = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True}
    tp_run = launch(assets, "ds-tp2", _recipe(assets, model_dir, 6, distributed=tp2), nproc=2)
    single_recipe = _recipe(assets, model_dir, 6, distributed={"strategy": "fsdp2"})
    single = launch(assets, "ds-tp1", single_recipe, nproc=1)
    _ok(tp_run, single)
    tp_losses, one_losses = ([r["loss"] for r in run.records("train")] for run in (tp_run, single))
    assert len(tp_losses) == 6 and tp_losses == pytest.approx(one_losses, rel=1e-4)
    tp_weights, one_weights = _weights(tp_run, 6), _weights(single, 6)
    assert tp_weights.keys() == one_weights.keys()
    for name, tensor in tp_weights.items():
        torch.testing.assert_close(tensor, one_weights[name], atol=1e-4, rtol=0, msg=name)


def test_lora_run_trains_and_resumes_from_its_adapter(assets, model_dir) -> None:
    peft = {"match_all_linear": True, "dim": 8, "alpha": 16}
    recipe = _recipe(assets, model_dir, 6, peft=peft, optimizer={"lr": 1.0e-2})
    first = launch(assets, "ds-lora", recipe, nproc=1)
    _ok(first)
    adapter = first.latest() / "model"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not (adapter / "model.safetensors").exists()
    losses = [r["loss"] for r in first.records("train")]
    assert losses[-1] < losses[0], losses
    more = {**recipe, "step_scheduler": {**recipe["step_scheduler"], "max_steps": 8}}
    resumed = launch(assets, "ds-lora-resume", more, nproc=1, run_dir=first.run_dir)
    _ok(resumed)
    assert any(e["event"] == "resumed" and e["step"] == 6 for e in resumed.events())
