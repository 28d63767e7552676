"""LoRA on Falcon-H1, a hybrid Mamba/attention family that runs with the Hugging Face class.

`target_modules: ['*_proj']` also selects the Mamba mixers' out_proj, which peft refuses:
the trainer's own validation refuses the recipe before any model is built (exit 2, the fix
in the message). With the fix the error gives (`exclude_modules: ['*.mamba.out_proj']`) the
same recipe trains: three steps, one process, and the saved adapter holds trained LoRA
weights for every other projection, the Mamba in_proj included, and none for out_proj.
"""

from __future__ import annotations

import json
import math

import pytest
from family_runs import build_tiny
from trainer_harness import Assets, base_recipe, launch

pytestmark = pytest.mark.slow

FALCON_H1 = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_d_ssm=64,
    mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16,
    max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
STEPS = 3
STAR_PROJ = {"target_modules": ["*_proj"]}


def _recipe(assets: Assets, model_dir, peft: dict) -> dict:
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": STEPS, "grad_accumulation_steps": 1,
                        "val_check_interval": STEPS, "checkpoint_interval": STEPS},
        peft={"dim": 8, "alpha": 16, **peft},
        optimizer={"lr": 1.0e-2},
    )  # fmt: skip
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    return recipe


def test_falcon_h1_star_proj_is_refused_at_submit_and_its_fix_trains(assets: Assets) -> None:
    from safetensors.torch import load_file

    model_dir = build_tiny(assets.root / "tiny-falcon-h1", "FalconH1Config", **FALCON_H1)
    refused = launch(assets, "falcon-h1-star-proj", _recipe(assets, model_dir, STAR_PROJ))
    assert refused.returncode == 2, refused.output[-3000:]
    assert "peft.target_modules" in refused.output and "*.mamba.out_proj" in refused.output

    fixed = {**STAR_PROJ, "exclude_modules": ["*.mamba.out_proj"]}
    run = launch(assets, "falcon-h1-lora", _recipe(assets, model_dir, fixed))
    assert run.returncode == 0, run.output[-3000:]
    losses = [r["loss"] for r in run.records("train")]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    adapter = run.latest() / "model"
    weights = load_file(adapter / "adapter_model.safetensors")
    trained = {k for k, v in weights.items() if "lora_B" in k and v.abs().sum() > 0}
    for name in ("mamba.in_proj", "self_attn.q_proj", "self_attn.o_proj", "feed_forward.down_proj"):
        assert any(f"layers.1.{name}.lora_B" in k for k in trained), name
    assert not any("out_proj" in k for k in weights)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["exclude_modules"]  # the exclusion the run trained with is saved with it
