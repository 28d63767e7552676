"""Phi-3 trains, ties as its checkpoints do, and is refused at submit where unproven.

A few AdamW steps lower the loss with every parameter receiving a gradient (partial rotary
+ longrope past the original length); tied configs alias lm_head to the embedding and save
one tensor, untied keep two (TieSupport.BOTH); LoRA is accepted and context parallelism
refused by the recipe contract with a field and a fix.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import assert_registry_row_agrees, train_losses
from phi3_tiny import ORIGINAL, VOCAB, phi3_config
from safetensors import safe_open

from jobs.recipe.model.config import capability_errors
from models import AutoModelForCausalLM
from models.hooks import decoder_layers
from models.phi3.model import Phi3ForCausalLM


@pytest.mark.parametrize("variant", ["plain", "phi4mini"])
def test_loss_falls_and_every_parameter_gets_a_gradient(variant):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(phi3_config(variant)).train()
    assert all(p.requires_grad for p in model.parameters())
    ids = torch.randint(1, VOCAB, (4, ORIGINAL + 8))
    losses = train_losses(model, ids, nonzero_grads=True)
    assert losses[-1] < losses[0] - 0.5, losses
    assert len(decoder_layers(model)) == 2


def _aliased(model) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def test_both_ties_alias_when_tied_and_separate_when_not(tmp_path):
    tied = AutoModelForCausalLM.from_config(phi3_config(tie_word_embeddings=True))
    untied = AutoModelForCausalLM.from_config(phi3_config(tie_word_embeddings=False))
    assert _aliased(tied) and not _aliased(untied)
    assert Phi3ForCausalLM._tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}
    tied.save_pretrained(tmp_path / "tied")
    untied.save_pretrained(tmp_path / "untied")
    with safe_open(tmp_path / "tied" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    with safe_open(tmp_path / "untied" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" in set(f.keys())
    assert _aliased(AutoModelForCausalLM.from_pretrained(tmp_path / "tied"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tied")
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()


def test_lora_is_accepted_and_context_parallel_refused_at_submit():
    errors = capability_errors("Phi3ForCausalLM", {"cp_size": 2}, peft_enabled=True)
    assert [e.loc for e in errors] == ["distributed.cp_size"]
    assert (
        capability_errors("Phi3ForCausalLM", {"tp_size": 2, "sequence_parallel": True}, False) == []
    )


def test_class_agrees_with_its_registry_row():
    from models import registry
    from models.phi3.parallelize import PHI3_PLAN
    from models.phi3.state_dict_adapter import Phi3StateDictAdapter

    entry, cls = assert_registry_row_agrees("Phi3ForCausalLM", "phi3", phi3_config().model_type)
    assert cls is Phi3ForCausalLM
    caps = entry.capabilities
    assert caps.supports_tp and caps.supports_sequence_parallel and caps.supports_fsdp
    assert caps.supports_lora
    assert not (caps.supports_pp or caps.supports_cp or caps.supports_ep)
    assert registry.load_parallel_plan(entry) is PHI3_PLAN
    assert registry.load_state_dict_adapter(entry) is Phi3StateDictAdapter
    assert entry.config_model_types == (phi3_config().model_type,) == ("phi3",)
    assert Phi3ForCausalLM._keep_in_fp32_modules_strict == []
