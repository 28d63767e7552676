"""Phi-3 LoRA: adapters trained on the native split projections load onto transformers'
fused Phi-3 with the same logits (the trainer's adapter export fuses them exactly).

All-linear LoRA, a partial target list (q, v, up only: the other blocks of the fused
adapter stay zero), DoRA on every part, and the trainer's `save_lora_adapter` loaded with
`AutoPeftModelForCausalLM`, and the fused base a from_config run saves beside it; DoRA on
some parts only is refused with the reason.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from peft import (
    AutoPeftModelForCausalLM,
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
)
from phi3_tiny import VOCAB, phi3_config
from safetensors.torch import save_file

from models import AutoModelForCausalLM
from models.phi3.state_dict_adapter import FusedMappingError, fuse_lora_adapter
from trainer.checkpoint.consolidate import save_lora_adapter, save_lora_base_model

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _trained_peft(tmp_path, targets, dora=False):
    """A native Phi-3 with random (non-zero) LoRA weights, its base saved for transformers."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(phi3_config("phi4mini", tie_word_embeddings=False))
    model.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(
        model,
        LoraConfig(r=4, lora_alpha=8, target_modules=targets, use_dora=dora, task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.2)
    return peft_model.eval()


def _assert_same_logits(native, hf_peft, tmp_path):
    ids = torch.randint(1, VOCAB, (2, 40))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")(input_ids=ids)
    ours, theirs = native(input_ids=ids).logits, hf_peft(input_ids=ids).logits
    assert (theirs - base.logits).abs().max() > 1e-2  # the adapter did load and act
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("targets", "dora"),
    [(ALL, False), (["q_proj", "v_proj", "up_proj"], False), (ALL, True)],
    ids=["all", "partial", "dora"],
)
def test_fused_adapter_loads_onto_transformers_with_equal_logits(tmp_path, targets, dora):
    native = _trained_peft(tmp_path, targets, dora)
    config = native.peft_config["default"]
    state, fused = fuse_lora_adapter(get_peft_model_state_dict(native), config, native.config)
    assert "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight" in state
    assert not any(".q_proj." in k or ".gate_proj." in k for k in state)
    assert config.r == 4 and config.target_modules == set(targets)  # the live config kept
    (tmp_path / "adapter").mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "adapter" / "adapter_model.safetensors")  # fmt: skip
    fused.save_pretrained(str(tmp_path / "adapter"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    _assert_same_logits(
        native, PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval(), tmp_path
    )


def test_partial_adapter_ranks_and_scales(tmp_path):
    native = _trained_peft(tmp_path, ["q_proj", "v_proj", "up_proj"])
    state, fused = fuse_lora_adapter(
        get_peft_model_state_dict(native), native.peft_config["default"], native.config
    )
    qkv = "base_model.model.model.layers.1.self_attn.qkv_proj"
    assert state[f"{qkv}.lora_A.weight"].shape == (8, 64)  # q and v: rank 2 x 4
    b = state[f"{qkv}.lora_B.weight"]
    assert b.shape == (128, 8) and torch.count_nonzero(b[64:96]) == 0  # k rows untouched
    assert fused.rank_pattern["model.layers.1.self_attn.qkv_proj"] == 8
    assert fused.alpha_pattern["model.layers.1.self_attn.qkv_proj"] == 16  # alpha/rank kept
    assert fused.rank_pattern["model.layers.1.mlp.gate_up_proj"] == 4


def test_dora_on_some_parts_only_is_refused(tmp_path):
    native = _trained_peft(tmp_path, ["q_proj", "v_proj"], dora=True)
    with pytest.raises(FusedMappingError, match="DoRA adapted"):
        fuse_lora_adapter(
            get_peft_model_state_dict(native), native.peft_config["default"], native.config
        )


def test_trainer_adapter_export_loads_with_auto_peft(tmp_path):
    native = _trained_peft(tmp_path, ALL)
    save_lora_adapter(native, tmp_path / "model", is_rank0=True, base_model=str(tmp_path / "base"))
    hf_peft = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "model")).eval()
    _assert_same_logits(native, hf_peft, tmp_path)


def test_a_from_config_runs_base_is_saved_fused(tmp_path):
    """A LoRA run built from a config saves its frozen base beside the adapter."""
    native = _trained_peft(tmp_path, ALL)
    save_lora_base_model(native, tmp_path / "base_model", is_rank0=True)
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base_model").eval()
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    ids = torch.randint(1, VOCAB, (2, 40))
    torch.testing.assert_close(saved(input_ids=ids).logits, reference(input_ids=ids).logits)
