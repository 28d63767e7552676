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
from mistral_family_configs import VOCAB, make_family_config, train_losses

from models import AutoModelForCausalLM


@pytest.mark.parametrize("family", ["mistral", "mixtral"])
def test_lora_trains_adapters_only_and_applies_to_transformers(family, tmp_path):
    from peft import PeftModel

    from jobs.recipe.typed import Peft
    from trainer.builders import apply_peft

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(make_family_config(family)).save_pretrained(
        tmp_path / "base"
    )
    native = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype="float32")
    assert native.tuneyard_backend == "native"
    base = {n: p.detach().clone() for n, p in native.named_parameters()}
    model = apply_peft(native, Peft(None, None, True, 8, 16.0, 0.0, "post", False, False))
    model.train()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("self_attn.q_proj" in n for n in trainable)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, 20))
    losses = train_losses(model, ids, steps=6, lr=1e-2)
    assert losses[-1] < losses[0] - 0.1, losses
    for name, param in native.named_parameters():
        if "lora_" not in name and name in base:
            assert torch.equal(param, base[name]), name
    model.save_pretrained(tmp_path / "adapter")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reference = PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    torch.testing.assert_close(
        model.eval()(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=0
    )
