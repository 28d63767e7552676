"""trainer.qlora: which layers bitsandbytes quantizes, what the model answers afterwards,
and the parameters FSDP2 must leave whole."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.sections.quantization import Quantization
from trainer.errors import TrainerError
from trainer.qlora import quantize_model, quantized_params

bnb = pytest.importorskip("bitsandbytes")


class Tiny(nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)
        self.head = nn.Linear(64, 32, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.relu(self.up(self.embed(ids)))))


def quantized(bits: int, tied: bool = False) -> tuple[Tiny, Tiny]:
    torch.manual_seed(0)
    model = Tiny(tied)
    reference = Tiny(tied)
    reference.load_state_dict(model.state_dict())
    config = Quantization(bits=bits, compute_dtype="float32", quant_storage="uint8")
    return quantize_model(model, config, torch.device("cpu")), reference


def test_four_bit_quantizes_every_linear_but_the_head() -> None:
    model, reference = quantized(4)
    assert isinstance(model.up, bnb.nn.Linear4bit) and isinstance(model.down, bnb.nn.Linear4bit)
    assert type(model.head) is nn.Linear and model.is_loaded_in_4bit
    assert model.up.weight.quant_state.quant_type == "nf4"
    assert not model.up.weight.requires_grad and not model.up.bias.requires_grad
    assert quantized_params(model) == {model.up.weight, model.down.weight}
    weight = bnb.functional.dequantize_4bit(model.up.weight.data, model.up.weight.quant_state)
    # nf4: each 64-weight block to 16 levels of its largest value, about 10% error
    error = (weight - reference.up.weight).norm() / reference.up.weight.norm()
    assert 0 < error < 0.15
    x = torch.randn(4, 64)
    with torch.no_grad():
        want = nn.functional.linear(x, weight, reference.up.bias)
        torch.testing.assert_close(model.up(x), want, rtol=1e-4, atol=1e-5)


def test_an_eval_forward_leaves_the_training_kernel_unchanged() -> None:
    """bitsandbytes repacks a 4-bit weight for its CPU inference kernel at the first no-grad
    eval forward on an AVX512-BF16 CPU; a run that validates, then trains on, must keep the
    layout it trained with (a resume's probe forward would otherwise change later steps)."""
    model, _ = quantized(4)
    ids = torch.randint(0, 32, (2, 8))
    model.train()
    before = model(ids).detach()
    model.eval()
    with torch.no_grad():
        model(ids)
    model.train()
    assert not getattr(model.up.weight.quant_state, "packing_format_for_cpu", False)
    assert torch.equal(model(ids).detach(), before)


def test_eight_bit_holds_int8_weights() -> None:
    model, reference = quantized(8)
    assert isinstance(model.up, bnb.nn.Linear8bitLt) and model.up.weight.dtype == torch.int8
    assert model.is_loaded_in_8bit
    ids = torch.arange(16).view(2, 8)
    with torch.no_grad():
        assert torch.allclose(model(ids), reference(ids), atol=0.05)


def test_a_head_tied_to_the_embedding_stays_whole() -> None:
    model, _ = quantized(4, tied=True)
    assert type(model.head) is nn.Linear and model.head.weight is model.embed.weight


def test_a_model_without_linear_layers_is_an_error() -> None:
    model = nn.Sequential(nn.Embedding(4, 4))
    with pytest.raises(TrainerError, match="no linear layers to quantize") as raised:
        quantize_model(model, Quantization(bits=4), torch.device("cpu"))
    assert raised.value.exit_code == ExitCode.DATA_ERROR


def test_an_unquantized_model_has_no_quantized_params() -> None:
    assert quantized_params(Tiny()) == set()
