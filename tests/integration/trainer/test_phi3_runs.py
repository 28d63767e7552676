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

import family_runs
import pytest
from trainer_harness import Assets, RunResult, launch, transformers_val_loss

pytestmark = pytest.mark.slow

TINY = {
    **family_runs.TINY_DENSE,
    "intermediate_size": 96,
    "original_max_position_embeddings": 8,
    "partial_rotary_factor": 0.75,
    "sliding_window": 6,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(6)],
        "long_factor": [1.5 + 0.4 * i for i in range(6)],
    },
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def tiny_phi3(assets: Assets) -> Path:
    return family_runs.build_tiny(assets.root / "tiny-phi3", "Phi3Config", **TINY)


@pytest.fixture(scope="module")
def phi3_runs(assets: Assets, tiny_phi3: Path) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    return family_runs.tp_and_one_process_runs(assets, "phi3", tiny_phi3)


def test_phi3_tp_run_trains_like_one_process(phi3_runs, assets: Assets) -> None:
    family_runs.assert_trains_like_one_process(phi3_runs)
    tp_weights = family_runs.assert_weights_equal(phi3_runs)
    assert "model.layers.0.self_attn.qkv_proj.weight" in tp_weights
    assert not any(".q_proj." in k or ".gate_proj." in k for k in tp_weights)
    family_runs.assert_checkpoint_reproduces_val_loss(phi3_runs[0], assets)


def test_phi3_lora_adapter_loads_fused_with_auto_peft(assets: Assets, tiny_phi3, offline_hub):
    import json

    import peft
    import transformers
    from safetensors import safe_open

    recipe = family_runs.family_recipe(assets, tiny_phi3, family_runs.ONE_PROCESS)
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
