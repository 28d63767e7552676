"""Phi-3 parity with transformers in fp32, at the three levels, on tiny seeded configs.

1. A Hugging Face checkpoint loaded natively and saved again is identical, and a native
   save reloads in transformers with identical logits. 2. The rotary (default, partial,
   LongRoPE below and above `original_max_position_embeddings`), attention, MLP and norm
   match transformers' modules. 3. Logits and loss match to 1e-5 (tied and untied, padding,
   sliding window longer than the window), and within bf16 rounding in bf16.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import (
    assert_logits_and_loss_match,
    assert_padded_logits_match,
    assert_same_tensors,
)
from phi3_tiny import ORIGINAL, VARIANTS, VOCAB, phi3_config

from models import AutoModelForCausalLM
from models.common.layers import Attention, RMSNorm, SwiGLUMLP
from models.phi3.model import Phi3ForCausalLM
from models.phi3.rope import Phi3RotaryEmbedding
from models.phi3.state_dict_adapter import Phi3StateDictAdapter

ATOL = 1e-5
LENGTHS = (20, 48)  # below and above longrope's original length (32)


def _saved_hf(tmp_path, variant: str = "plain", **overrides):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(phi3_config(variant, **overrides)).eval()
    hf.save_pretrained(tmp_path / "hf")
    return hf, tmp_path / "hf"


def _pair(tmp_path, variant: str = "plain", **overrides):
    hf, directory = _saved_hf(tmp_path, variant, **overrides)
    native = AutoModelForCausalLM.from_pretrained(directory)
    assert isinstance(native, Phi3ForCausalLM) and native.tuneyard_backend == "native"
    return hf, native


@pytest.mark.parametrize("variant", VARIANTS)
def test_hf_checkpoint_round_trip_is_exact(variant, tmp_path):
    _, native = _pair(tmp_path, variant)
    native.save_pretrained(tmp_path / "native", max_shard_size=60_000)
    assert_same_tensors(tmp_path / "hf", tmp_path / "native")


@pytest.mark.parametrize("variant", VARIANTS)
def test_native_save_reloads_in_transformers_with_identical_logits(variant, tmp_path):
    torch.manual_seed(3)
    native = AutoModelForCausalLM.from_config(phi3_config(variant)).eval()
    native.save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(1, VOCAB, (2, 40))
    torch.testing.assert_close(
        native(input_ids=ids).logits, hf(input_ids=ids).logits, atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tied", [False, True])
def test_logits_and_loss_match(variant, tied, tmp_path):
    hf, native = _pair(tmp_path, variant, tie_word_embeddings=tied)
    assert (native.lm_head.weight is native.model.embed_tokens.weight) == tied
    torch.manual_seed(1)
    for length in LENGTHS:
        ids = torch.randint(1, VOCAB, (2, length))
        assert_logits_and_loss_match(hf, native, ids, masked=4, atol=ATOL)


@pytest.mark.parametrize("variant", ["plain", "window", "phi4mini"])
def test_padded_logits_match(variant, tmp_path):
    hf, native = _pair(tmp_path, variant)
    assert_padded_logits_match(hf, native, torch.randint(1, VOCAB, (2, 40)), atol=ATOL)


def test_sliding_window_changes_attention_beyond_the_window(tmp_path):
    _, windowed = _pair(tmp_path, "window")
    full = AutoModelForCausalLM.from_config(phi3_config("plain")).eval()
    full.load_state_dict(windowed.state_dict())
    ids = torch.randint(1, VOCAB, (1, 24))
    a, b = windowed(input_ids=ids).logits, full(input_ids=ids).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=ATOL, rtol=0)  # within the window
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-3


def _assert_rotary_matches(ours, ref) -> None:
    """(cos, sin) equal transformers' below and above the original length."""
    x = torch.zeros(1, 1, 8)
    for length in LENGTHS:
        positions = torch.arange(length).unsqueeze(0)
        for got, want in zip(ours(x, positions), ref(x, positions), strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", ["plain", "partial", "longrope", "phi4mini"])
def test_rotary_matches_below_and_above_the_original_length(variant):
    config = phi3_config(variant)
    ours, ref = Phi3RotaryEmbedding(config), transformers.Phi3Model(config).rotary_emb
    _assert_rotary_matches(ours, ref)


def test_longrope_with_explicit_factor_and_attention_factor_matches():
    base = phi3_config("longrope").rope_parameters
    config = phi3_config("longrope", rope_scaling={**base, "factor": 4.0, "attention_factor": 1.3})
    ours, ref = Phi3RotaryEmbedding(config), transformers.Phi3Model(config).rotary_emb
    assert ours.attention_scaling == 1.3
    _assert_rotary_matches(ours, ref)


def test_longrope_uses_long_factors_only_past_the_original_length():
    rotary = Phi3RotaryEmbedding(phi3_config("longrope"))
    x, early = torch.zeros(1, 1, 8), torch.arange(ORIGINAL).unsqueeze(0)
    short_cos = rotary(x, early)[0]
    long_cos = rotary(x, torch.arange(ORIGINAL + 1).unsqueeze(0))[0]
    assert (short_cos[0, 1:ORIGINAL] - long_cos[0, 1:ORIGINAL]).abs().max() > 1e-3
    torch.testing.assert_close(rotary(x, early)[0], short_cos)  # switching back is stateless
    assert rotary.attention_scaling > 1.0  # sqrt(1 + ln(256 / 32) / ln(32))


def _layers(tmp_path, variant: str):
    hf, native = _pair(tmp_path, variant)
    return hf.model.layers[0], native.model.layers[0], hf.model.rotary_emb


@pytest.mark.parametrize("variant", ["plain", "partial", "phi4mini"])
def test_attention_matches(variant, tmp_path):
    hf_layer, layer, rotary = _layers(tmp_path, variant)
    assert isinstance(layer.self_attn, Attention)
    hidden = torch.randn(2, 12, 64)
    cos_sin = rotary(hidden, torch.arange(12).unsqueeze(0).expand(2, -1))
    ref, _ = hf_layer.self_attn(
        hidden_states=hidden, position_embeddings=cos_sin, attention_mask=None
    )
    ours = layer.self_attn(hidden_states=hidden, position_embeddings=cos_sin)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


def test_mlp_and_norm_match(tmp_path):
    hf_layer, layer, _ = _layers(tmp_path, "plain")
    hidden = torch.randn(2, 12, 64)
    assert isinstance(layer.mlp, SwiGLUMLP) and isinstance(layer.input_layernorm, RMSNorm)
    torch.testing.assert_close(layer.mlp(hidden), hf_layer.mlp(hidden), atol=ATOL, rtol=0)
    with torch.no_grad():
        layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        hf_layer.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
    torch.testing.assert_close(
        layer.post_attention_layernorm(hidden),
        hf_layer.post_attention_layernorm(hidden),
        atol=ATOL,
        rtol=0,
    )


def test_bf16_logits_within_bf16_rounding(tmp_path):
    hf, directory = _saved_hf(tmp_path, "phi4mini")
    native = AutoModelForCausalLM.from_pretrained(directory, dtype="bfloat16")
    hf = hf.to(torch.bfloat16)
    assert native.model.layers[0].self_attn.q_proj.weight.dtype is torch.bfloat16
    ids = torch.randint(1, VOCAB, (2, 48))
    out, ref = native(input_ids=ids, labels=ids), hf(input_ids=ids, labels=ids)
    assert out.logits.dtype is torch.bfloat16
    torch.testing.assert_close(out.logits.float(), ref.logits.float(), atol=2e-2, rtol=0)
    torch.testing.assert_close(out.loss, ref.loss, atol=2e-2, rtol=0)


def test_residual_dropout_is_native_and_draws_as_transformers_does(tmp_path):
    hf, native = _pair(tmp_path, "phi4mini", resid_pdrop=0.2)
    ids = torch.randint(1, VOCAB, (2, 40))
    eval_logits = native(input_ids=ids).logits
    torch.testing.assert_close(eval_logits, hf(input_ids=ids).logits, atol=ATOL, rtol=0)
    hf.train(), native.train()
    torch.manual_seed(7)
    ref = hf(input_ids=ids, labels=ids)
    torch.manual_seed(7)
    out = native(input_ids=ids, labels=ids)
    assert (out.logits - eval_logits).abs().max() > 1e-2  # dropout is on while training
    torch.testing.assert_close(out.logits, ref.logits, atol=ATOL, rtol=0)  # same masks
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=0)


def test_a_longrope_factor_of_the_wrong_length_is_unsupported():
    config = phi3_config("longrope")
    config.rope_parameters = {**config.rope_parameters, "short_factor": [1.0] * 3}
    assert "short_factor must hold 8" in Phi3ForCausalLM.unsupported_reason(config)


def test_state_dict_is_the_split_layout(tmp_path):
    _, native = _pair(tmp_path)
    keys = set(native.state_dict())
    assert (
        "model.layers.0.self_attn.k_proj.weight" in keys
        and "model.layers.0.mlp.up_proj.weight" in keys
    )
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in keys)
    assert native.state_dict_adapter() is Phi3StateDictAdapter
