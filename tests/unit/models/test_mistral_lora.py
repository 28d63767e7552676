"""LoRA on native Mistral and Mixtral through the trainer's `apply_peft`, proven end to end.

All-linear LoRA trains only the adapters (the attention and dense projections; Mixtral's
grouped experts and router are parameters, not linears, as in transformers), the base
weights stay bit-equal, the loss falls, and the saved adapter applied with PEFT to the
transformers class over the same base checkpoint gives the native model's logits.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import assert_lora_trains_adapters_and_applies_to_hf
from mistral_family_configs import VOCAB, make_family_config


@pytest.mark.parametrize("family", ["mistral", "mixtral"])
def test_lora_trains_adapters_only_and_applies_to_transformers(family, tmp_path):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(make_family_config(family)).save_pretrained(
        tmp_path / "base"
    )
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, 20))
    trainable = assert_lora_trains_adapters_and_applies_to_hf(
        tmp_path / "base", tmp_path / "adapter", ids, ids, steps=6, lr=1e-2
    )
    assert any("self_attn.q_proj" in n for n in trainable)
