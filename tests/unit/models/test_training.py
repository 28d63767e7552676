"""A few optimizer steps on a fixed batch lower the loss for every native family."""

from __future__ import annotations

import torch
from tiny_model_configs import make_config

from models import AutoModelForCausalLM
from models.hooks import decoder_layers


def test_loss_falls_and_every_parameter_gets_a_gradient(family):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(family)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(1, 512, (4, 32))
    losses = []
    for _ in range(8):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if not losses:
            assert all(p.grad is not None for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    assert len(decoder_layers(model)) == 2


def test_num_items_in_batch_sums_then_divides():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config("llama"))
    ids = torch.randint(1, 512, (2, 8))
    mean = model(input_ids=ids, labels=ids).loss
    summed = model(input_ids=ids, labels=ids, num_items_in_batch=28).loss
    torch.testing.assert_close(summed, mean * 14 / 28)  # 2 rows x 7 shifted labels


def test_unsupported_forward_arguments_are_refused():
    model = AutoModelForCausalLM.from_config(make_config("llama"))
    ids = torch.randint(1, 512, (1, 4))
    model(input_ids=ids, use_cache=False, output_hidden_states=None, return_dict=True)
    import pytest

    with pytest.raises(TypeError, match="output_hidden_states"):
        model(input_ids=ids, output_hidden_states=True)
