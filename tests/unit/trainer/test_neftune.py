"""NEFTune (trainer.neftune): uniform noise of scale alpha / sqrt(L * d) on the input
embeddings of training forwards only, found on native and Hugging Face models alike."""

from __future__ import annotations

import math

import torch

from cli.demo_assets import tiny_llama_config
from jobs.recipe.typed import Neftune
from models import AutoModelForCausalLM
from trainer.neftune import attach_neftune, input_embedding


def _embedded(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    seen = []
    handle = input_embedding(model).register_forward_hook(lambda m, i, out: seen.append(out))
    model(input_ids=ids)
    handle.remove()
    return seen[0]


def test_training_forwards_get_bounded_noise_and_validation_the_clean_embedding():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config())
    ids = torch.randint(0, 64, (2, 6))
    clean = input_embedding(model)(ids).detach()
    handle = attach_neftune(model, Neftune(noise_alpha=5.0))
    model.train()
    noise = (_embedded(model, ids) - clean).detach()
    bound = 5.0 / math.sqrt(ids.shape[1] * clean.shape[-1])
    assert 0.5 * bound < noise.abs().max() <= bound + 1e-6
    assert noise.abs().mean() > 0.25 * bound  # uniform on [-m, m]: mean |x| is m/2
    with torch.no_grad():  # validation
        assert torch.equal(_embedded(model, ids), clean)
    model.eval()
    assert torch.equal(_embedded(model, ids).detach(), clean)
    handle.remove()
    model.train()
    assert torch.equal(_embedded(model, ids).detach(), clean)


def test_no_section_or_zero_alpha_attaches_nothing():
    model = AutoModelForCausalLM.from_config(tiny_llama_config())
    assert attach_neftune(model, None) is None
    assert attach_neftune(model, Neftune(noise_alpha=0.0)) is None
