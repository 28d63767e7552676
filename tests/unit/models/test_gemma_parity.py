"""Gemma 2 / Gemma 3 text parity with transformers in fp32, at the three levels.

1. Checkpoint round trip: a saved HF checkpoint loads as the native class through
   `models.AutoModelForCausalLM`, saves again bit-identically, and the export reloads in
   transformers with identical logits. 2. Each rewritten layer (Gemma RMSNorm, scaled
   embedding, GeGLU MLP, soft-capped / windowed / q-k-normed attention, per-layer-type
   RoPE) equals the transformers module. 3. Full logits and loss within 1e-5 (left padding,
   a sequence longer than the sliding window, soft-caps that bend the logits); bf16 within
   a bf16 tolerance.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import assert_same_tensors
from gemma_tiny_configs import GEMMA_FAMILIES, HIDDEN, VOCAB, WINDOW, gemma_config, randomize_norms

from models import AutoModelForCausalLM
from models.common.layers import build_attention_mask
from models.gemma2.layers import GeGLUMLP, GemmaAttention, GemmaRMSNorm, ScaledEmbedding
from models.gemma2.model import Gemma2ForCausalLM
from models.gemma3.model import Gemma3ForCausalLM

ATOL = 1e-5
NATIVE = {"gemma2": Gemma2ForCausalLM, "gemma3": Gemma3ForCausalLM}


@pytest.fixture(params=GEMMA_FAMILIES)
def gemma(request) -> str:
    return request.param


def _hf(family: str, **overrides):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(gemma_config(family, **overrides))
    randomize_norms(hf)
    return hf.eval()


def _pair(family: str, dtype=torch.float32, **overrides):
    hf = _hf(family, **overrides).to(dtype)
    native = AutoModelForCausalLM.from_config(hf.config, dtype=dtype).eval()
    assert type(native) is NATIVE[family] and native.tuneyard_backend == "native"
    native.load_state_dict(hf.state_dict(), strict=True)
    return hf, native


def _batch(seq: int = 24):
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, seq))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    return ids, mask


def test_saved_checkpoint_loads_natively_round_trips_and_reloads_in_transformers(gemma, tmp_path):
    hf = _hf(gemma)
    hf.save_pretrained(tmp_path / "hf")
    native = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="float32")
    assert type(native) is NATIVE[gemma]
    ids, _ = _batch()
    torch.testing.assert_close(
        native(input_ids=ids).logits, hf(input_ids=ids).logits, atol=ATOL, rtol=0
    )
    native.save_pretrained(tmp_path / "native", max_shard_size=40_000)
    after = assert_same_tensors(tmp_path / "hf", tmp_path / "native")
    assert "lm_head.weight" not in after  # tied
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "native").eval()
    assert type(reloaded).__name__ == NATIVE[gemma].architecture
    assert torch.equal(reloaded(input_ids=ids).logits, hf(input_ids=ids).logits)


@pytest.mark.parametrize("padded", [False, True])
def test_logits_and_loss_match(gemma, padded):
    hf, native = _pair(gemma)
    ids, mask = _batch()
    attention_mask = mask if padded else None
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, :6] = -100  # a pad position's logits predict position 5: left out when padded
    ref = hf(input_ids=ids, attention_mask=attention_mask, labels=labels)
    out = native(input_ids=ids, attention_mask=attention_mask, labels=labels)
    keep = mask.bool() if padded else torch.ones_like(mask, dtype=torch.bool)
    torch.testing.assert_close(out.logits[keep], ref.logits[keep], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=0)


def test_test_config_exercises_softcaps_and_window(gemma):
    """Each feature changes the logits, so matching transformers above proves it."""
    _, native = _pair(gemma)
    ids, _ = _batch()
    base = native(input_ids=ids).logits
    assert base.abs().max() < 3.0  # the final cap binds
    variants = {"final_logit_softcapping": None, "sliding_window": 64}
    if gemma == "gemma2":
        variants["attn_logit_softcapping"] = None
    for field, value in variants.items():
        config = gemma_config(gemma, **{field: value})
        other = AutoModelForCausalLM.from_config(config).eval()
        other.load_state_dict(native.state_dict())
        assert not torch.allclose(other(input_ids=ids).logits, base, atol=1e-4), field


def test_bf16_logits_match_within_bf16_tolerance(gemma):
    hf, native = _pair(gemma, dtype=torch.bfloat16)
    ids, _ = _batch()
    out, ref = native(input_ids=ids).logits, hf(input_ids=ids).logits
    assert out.dtype is torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=2e-2)


def test_embedding_scale_is_rounded_to_the_weight_dtype(gemma):
    hf, native = _pair(gemma, dtype=torch.bfloat16)
    assert isinstance(native.model.embed_tokens, ScaledEmbedding)
    ids, _ = _batch()
    out = native.model.embed_tokens(ids)
    assert torch.equal(out, hf.model.embed_tokens(ids))
    raw = torch.nn.functional.embedding(ids, native.model.embed_tokens.weight)
    assert torch.equal(out, raw * torch.tensor(HIDDEN**0.5).to(torch.bfloat16))


def test_norm_and_mlp_match(gemma):
    hf, native = _pair(gemma)
    layer, ref = native.model.layers[0], hf.model.layers[0]
    hidden = torch.randn(2, 12, HIDDEN)
    assert isinstance(layer.mlp, GeGLUMLP)
    torch.testing.assert_close(layer.mlp(hidden), ref.mlp(hidden), atol=ATOL, rtol=0)
    for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):  # fmt: skip
        norm = getattr(layer, name)
        assert isinstance(norm, GemmaRMSNorm)
        torch.testing.assert_close(norm(hidden), getattr(ref, name)(hidden), atol=ATOL, rtol=0)
    half = hidden.to(torch.bfloat16)
    norm, ref_norm = layer.input_layernorm, ref.input_layernorm
    assert torch.equal(norm(half), ref_norm(half))  # cast after the (1 + w) product


def _hf_rope(hf, family: str, layer_type: str, hidden, positions):
    if family == "gemma2":
        return hf.model.rotary_emb(hidden, positions)
    return hf.model.rotary_emb(hidden, positions, layer_type)


@pytest.mark.parametrize("layer_idx", [0, 1])  # 0: sliding window, 1: full attention
def test_attention_matches(gemma, layer_idx):
    hf, native = _pair(gemma)
    attn, ref = native.model.layers[layer_idx].self_attn, hf.model.layers[layer_idx].self_attn
    assert isinstance(attn, GemmaAttention)
    assert attn.sliding_window == (WINDOW if layer_idx == 0 else None)
    assert (attn.q_norm is not None) == (gemma == "gemma3")
    seq = 20
    hidden = torch.randn(2, seq, HIDDEN)
    positions = torch.arange(seq).unsqueeze(0).expand(2, -1)
    layer_type = native.model.layers[layer_idx].layer_type
    cos_sin = _hf_rope(hf, gemma, layer_type, hidden, positions)
    padding = torch.ones(2, seq, dtype=torch.long)
    padding[0, :3] = 0
    mask = build_attention_mask(padding, None, 2, seq, hidden.device, attn.sliding_window)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    ours = attn(hidden_states=hidden, position_embeddings=cos_sin, attention_mask=mask)
    theirs, _ = ref(hidden_states=hidden, position_embeddings=cos_sin, attention_mask=additive)
    torch.testing.assert_close(ours[0, 3:], theirs[0, 3:], atol=ATOL, rtol=0)
    torch.testing.assert_close(ours[1], theirs[1], atol=ATOL, rtol=0)


def test_rope_per_layer_type_matches(gemma):
    hf, native = _pair(gemma)
    positions = torch.arange(200).unsqueeze(0)
    x = torch.zeros(1, 200, 16)
    ours = native.model.position_embeddings(x, positions)
    for layer_type in ("sliding_attention", "full_attention"):
        ref = _hf_rope(hf, gemma, layer_type, x, positions)
        for a, b in zip(ours[layer_type], ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    if gemma == "gemma3":  # distinct local and global bases
        assert not torch.allclose(ours["sliding_attention"][0], ours["full_attention"][0])


def test_gemma3_legacy_rope_local_base_freq_is_honoured():
    config = transformers.Gemma3TextConfig(
        **{
            k: v for k, v in gemma_config("gemma3").to_diff_dict().items() if k != "rope_parameters"
        },
        rope_local_base_freq=5000.0,
        rope_theta=2e5,
    )
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 5000.0
    native = AutoModelForCausalLM.from_config(config)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    x, positions = torch.zeros(1, 50, 16), torch.arange(50).unsqueeze(0)
    ours = native.model.position_embeddings(x, positions)
    for layer_type in ("sliding_attention", "full_attention"):
        torch.testing.assert_close(
            ours[layer_type][1], hf.model.rotary_emb(x, positions, layer_type)[1], atol=1e-6, rtol=0
        )


def test_packed_rows_do_not_attend_across_samples(gemma):
    """Packed samples (position ids restarting at 0) are isolated, windows included."""
    _, native = _pair(gemma)
    ids = torch.randint(1, VOCAB, (1, 26))
    positions = torch.cat([torch.arange(12), torch.arange(14)]).unsqueeze(0)
    packed = native(input_ids=ids, position_ids=positions).logits
    separate = torch.cat(
        [native(input_ids=ids[:, :12]).logits, native(input_ids=ids[:, 12:]).logits], dim=1
    )
    torch.testing.assert_close(packed, separate, atol=ATOL, rtol=0)
