"""gpt-oss training: AdamW steps lower the loss, LoRA trains adapters only, registry row.

A few AdamW steps on a fixed batch lower the loss, with a gradient for every parameter
(sinks, router bias, expert biases included) and the load-balancing loss switched on.
LoRA through the trainer's `apply_peft` ("all-linear": the attention projections; the
grouped experts and the router are parameters, not linears) trains only the adapters,
leaves the base weights untouched, and the saved adapter applied to transformers'
`GptOssForCausalLM` gives the same logits. The registry row agrees with the class.
"""

from __future__ import annotations

import pytest
import torch
from family_checks import (
    assert_lora_trains_adapters_and_applies_to_hf,
    assert_registry_row_agrees,
    fixed_batch,
    train_losses,
)
from gpt_oss_tiny import VOCAB, seeded_hf_model, tiny_config

from models import AutoModelForCausalLM
from models.gpt_oss import GptOssForCausalLM
from models.hooks import decoder_layers
from models.registry import TieSupport


def test_loss_falls_and_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(output_router_logits=True)).train()
    assert isinstance(model, GptOssForCausalLM)
    losses = train_losses(model, fixed_batch(VOCAB))
    assert losses[-1] < losses[0] - 0.5, losses
    assert len(decoder_layers(model)) == 2


def test_lora_trains_adapters_only_and_the_adapter_applies_to_transformers(tmp_path):
    seeded_hf_model().save_pretrained(tmp_path / "base")
    ids = fixed_batch(VOCAB)
    compare_ids = torch.randint(1, VOCAB, (2, 20))
    trainable = assert_lora_trains_adapters_and_applies_to_hf(
        tmp_path / "base", tmp_path / "adapter", ids, compare_ids, steps=8, lr=5e-2
    )
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_registry_row_agrees_with_the_class():
    entry, cls = assert_registry_row_agrees("GptOssForCausalLM", "gpt_oss", "gpt_oss")
    assert cls is GptOssForCausalLM and entry.tie_support is TieSupport.UNTIED_ONLY


def test_context_parallel_is_refused_by_the_attention():
    model = AutoModelForCausalLM.from_config(tiny_config())
    model.model.layers[0].self_attn.context_parallel = object()
    with pytest.raises(ValueError, match="no context-parallel path"):
        model(input_ids=torch.randint(1, VOCAB, (1, 8)))
