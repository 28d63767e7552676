"""Native Mixtral against transformers in fp32: MoE block, router, logits, loss, aux loss.

Checks run on sequences longer than the sliding window, with padding, tied and untied, and
cover the checkpoint round trip (Mixtral's `block_sparse_moe.experts.{e}.w1/w2/w3` names),
the transformers reload of a native save, seeded router jitter in training, bf16, and a
short training run.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import (
    assert_logits_and_loss_match,
    assert_padded_logits_match,
    assert_save_round_trips_and_reloads,
    read_safetensors_dir,
    train_losses,
)
from mistral_family_configs import VOCAB, mixtral_config
from tiny_model_configs import hf_to_native_state

from models import AutoModelForCausalLM
from models.mixtral.layers import MixtralSparseMoeBlock
from models.mixtral.model import MixtralForCausalLM

ATOL = 1e-5


def _pair(**overrides):
    config = mixtral_config(**overrides)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    native = AutoModelForCausalLM.from_config(config).eval()
    assert type(native) is MixtralForCausalLM
    native.load_state_dict(hf_to_native_state(hf.state_dict()), strict=True)
    return hf, native


def _ids(batch: int = 2, seq: int = 20) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(1, VOCAB, (batch, seq))


def test_moe_block_and_router_match():
    hf, native = _pair()
    block, ref_block = native.model.layers[0].mlp, hf.model.layers[0].mlp
    assert isinstance(block, MixtralSparseMoeBlock) and block.experts.num_experts == 4
    hidden = torch.randn(2, 12, 64)
    torch.testing.assert_close(block(hidden), ref_block(hidden), atol=ATOL, rtol=0)
    ref_logits, ref_weights, ref_experts = ref_block.gate(hidden.reshape(-1, 64))
    logits, weights, experts = block.gate(hidden.reshape(-1, 64))
    assert torch.equal(experts, ref_experts)
    torch.testing.assert_close(weights, ref_weights, atol=ATOL, rtol=0)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(24))  # always renormalised


@pytest.mark.parametrize(("tied", "window"), [(False, 6), (True, 6), (False, None)])
def test_logits_and_loss_match(tied, window):
    hf, native = _pair(tie_word_embeddings=tied, sliding_window=window)
    assert_logits_and_loss_match(hf, native, _ids(), masked=3, atol=ATOL)


def test_padded_logits_match():
    hf, native = _pair()
    assert_padded_logits_match(hf, native, _ids(), atol=ATOL)


def test_load_balancing_loss_matches():
    hf, native = _pair(output_router_logits=True, router_aux_loss_coef=0.1)
    ids = _ids(2, 12)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    for attention_mask in (None, mask):
        ref = hf(input_ids=ids, attention_mask=attention_mask, labels=labels)
        out = native(input_ids=ids, attention_mask=attention_mask, labels=labels)
        assert out.aux_loss is not None and out.aux_loss.item() > 0
        torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=0)
    assert _pair()[1](input_ids=ids).aux_loss is None


def test_router_jitter_matches_in_training():
    hf, native = _pair(router_jitter_noise=0.1)
    hf.train(), native.train()
    ids = _ids()
    torch.manual_seed(5)
    ref = hf(input_ids=ids, labels=ids)
    torch.manual_seed(5)
    out = native(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=0)
    torch.manual_seed(6)
    assert (native(input_ids=ids, labels=ids).loss - ref.loss).abs() > 1e-6  # noise is live


def test_router_stays_fp32_and_bf16_logits_stay_close():
    hf, native = _pair()
    hf, native = hf.to(torch.bfloat16), native.to(torch.bfloat16)
    native._restore_fp32_modules()
    assert native.model.layers[0].mlp.gate.weight.dtype is torch.float32
    assert native.model.layers[0].mlp.experts.gate_proj.dtype is torch.bfloat16
    built = AutoModelForCausalLM.from_config(mixtral_config(), dtype="bfloat16")
    assert built.model.layers[1].mlp.gate.weight.dtype is torch.float32
    ids = _ids()
    ref, out = hf(input_ids=ids).logits.float(), native(input_ids=ids).logits
    assert out.dtype is torch.bfloat16 and (out.float() - ref).abs().max() < 5e-2


def test_checkpoint_round_trip_and_transformers_reload(tmp_path):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(mixtral_config()).save_pretrained(tmp_path / "hf")
    before = read_safetensors_dir(tmp_path / "hf")
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in before
    assert_save_round_trips_and_reloads(
        tmp_path / "hf", tmp_path / "native", MixtralForCausalLM, _ids(), ATOL
    )


def test_training_lowers_the_loss():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mixtral_config(output_router_logits=True)).train()
    losses = train_losses(model, _ids(4, 24))
    assert losses[-1] < losses[0] - 0.5, losses
