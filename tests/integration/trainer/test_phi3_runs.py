"""Two-rank torchrun run (gloo) of a tiny native Phi-3 with `tp_size: 2` and sequence parallel.

It proves the row's tensor-parallel claim end to end through the recipe, on a
Phi-4-mini-like config: partial rotary, LongRoPE with an original length (8) shorter than the
training samples (the long factors run), and a sliding window the samples cross. The tp2
run trains 10 steps to the losses and weights of a one-process run of the same recipe, and
its consolidated checkpoint (fused `qkv_proj` / `gate_up_proj`, as transformers stores
Phi-3), loaded with plain transformers, reproduces its validation loss. A LoRA run
(FSDP2, 2 ranks, all linear layers) exports an adapter fused for transformers' Phi-3
(`qkv_proj` / `gate_up_proj`) that transformers (through PEFT) loads to the same
validation loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import Assets, RunResult, base_recipe, launch, transformers_val_loss

pytestmark = pytest.mark.slow

TINY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    original_max_position_embeddings=8, partial_rotary_factor=0.75, sliding_window=6,
    rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(6)],
                  "long_factor": [1.5 + 0.4 * i for i in range(6)]},
    bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
)  # fmt: skip


def build_tiny_phi3(directory: Path) -> Path:
    import transformers

    from trainer.assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.Phi3Config(**TINY))
    model.save_pretrained(directory)
    return directory


def phi3_recipe(assets: Assets, distributed: dict) -> dict:
    recipe = base_recipe(
        assets,
        distributed=distributed,
        step_scheduler={"max_steps": 10, "grad_accumulation_steps": 1},
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(assets.root / "tiny-phi3")
    return recipe


def step_10(run: RunResult) -> Path:
    return run.run_dir / "checkpoints" / "step_10" / "model"


def trained_weights(run: RunResult) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in step_10(run).glob("*.safetensors"):
        weights.update(load_file(path))
    return weights


@pytest.fixture(scope="module")
def tiny_phi3(assets: Assets) -> Path:
    return build_tiny_phi3(assets.root / "tiny-phi3")


@pytest.fixture(scope="module")
def phi3_runs(assets: Assets, tiny_phi3: Path) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    tp2 = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True}
    tp_run = launch(assets, "tp2-phi3", phi3_recipe(assets, tp2), nproc=2)
    return tp_run, launch(assets, "tp1-phi3", phi3_recipe(assets, {"strategy": "fsdp2"}), nproc=1)


def test_phi3_tp_run_trains_like_one_process(phi3_runs, assets: Assets) -> None:
    for run in phi3_runs:
        assert run.returncode == 0, run.output[-3000:]
    tp_losses, single_losses = ([r["loss"] for r in run.records("train")] for run in phi3_runs)
    assert len(tp_losses) == 10
    assert sum(tp_losses[-3:]) / 3 < 0.8 * sum(tp_losses[:3]) / 3, tp_losses
    assert tp_losses == pytest.approx(single_losses, rel=1e-4)
    tp_weights, single_weights = (trained_weights(run) for run in phi3_runs)
    assert "model.layers.0.self_attn.qkv_proj.weight" in tp_weights
    assert not any(".q_proj." in k or ".gate_proj." in k for k in tp_weights)
    assert tp_weights.keys() == single_weights.keys()
    for name, tensor in tp_weights.items():
        torch.testing.assert_close(tensor, single_weights[name], atol=1e-4, rtol=0, msg=name)
    val = [r for r in phi3_runs[0].records("val") if r["step"] == 10]
    assert val and transformers_val_loss(step_10(phi3_runs[0]), assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )


def test_phi3_lora_adapter_loads_fused_with_auto_peft(assets: Assets, tiny_phi3, offline_hub):
    import json

    import peft
    import transformers
    from safetensors import safe_open

    recipe = phi3_recipe(assets, {"strategy": "fsdp2"})
    recipe["step_scheduler"].update(max_steps=6, val_check_interval=6, checkpoint_interval=6)
    recipe["peft"] = {"match_all_linear": True, "dim": 8, "alpha": 16}
    recipe["optimizer"]["lr"] = 1.0e-2
    run = launch(assets, "lora-phi3", recipe, nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    adapter_dir = run.latest() / "model"
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert any(".qkv_proj.lora_A." in n for n in names)
    assert not any(".q_proj." in n or ".gate_proj." in n for n in names)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["rank_pattern"]["model.layers.0.self_attn.qkv_proj"] == 24
    # transformers finds adapter_config.json and loads the base and the adapter through PEFT
    model = transformers.AutoModelForCausalLM.from_pretrained(adapter_dir)
    assert isinstance(model.peft_config["default"], peft.LoraConfig)
    assert transformers_val_loss(adapter_dir, assets.val) == pytest.approx(
        run.records("val")[-1]["val_loss"], rel=1e-4
    )
