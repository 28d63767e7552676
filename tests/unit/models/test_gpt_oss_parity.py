"""gpt-oss parity with transformers at three levels, on tiny seeded configs.

State dict: a saved Hugging Face checkpoint loads into the native class and comes back
out with the same names, shapes, dtypes and values; the adapter's key mapping and
transposes are checked directly. Layers: norm, YaRN rotary, sink attention (sliding and
full), router, experts (clamps active) and the MoE block against transformers' modules
with the same weights. End to end: `models.AutoModelForCausalLM.from_pretrained` returns
the native class and matches transformers' logits and loss to 1e-5 in fp32 (padding and
the load-balancing loss included); bf16 stays as close to the fp32 reference as
transformers' own bf16 run; the native export reloads in transformers with equal logits.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import assert_logits_and_loss_match, assert_padded_logits_match
from gpt_oss_tiny import seeded_hf_model, tiny_config, token_batch
from transformers.models.gpt_oss import modeling_gpt_oss as hf_gpt_oss

from models import AutoModelForCausalLM
from models.common.layers import build_attention_mask
from models.common.rope import RotaryEmbedding
from models.gpt_oss import GptOssForCausalLM
from models.gpt_oss.layers import GptOssAttention, GptOssExperts, GptOssMoeBlock, GptOssRMSNorm
from models.gpt_oss.state_dict_adapter import ExpertLayoutError, GptOssStateDictAdapter

FP32 = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved tiny Hugging Face checkpoint and the model it came from."""
    hf = seeded_hf_model()
    directory = tmp_path_factory.mktemp("gpt_oss_hf")
    hf.save_pretrained(directory)
    return directory, hf


# --- state dict ---------------------------------------------------------------------
def test_adapter_maps_keys_and_transposes_only_the_expert_projections(checkpoint):
    _, hf = checkpoint
    config = hf.config
    native = GptOssForCausalLM(config)
    native_state = dict(native.named_parameters())
    hf_state = hf.state_dict()
    assert set(native_state) == set(hf_state)
    prefix = "model.layers.0.mlp.experts."
    assert native_state[prefix + "gate_up_proj"].shape == (4, 96, 32)
    assert hf_state[prefix + "gate_up_proj"].shape == (4, 32, 96)
    assert native_state[prefix + "down_proj"].shape == (4, 32, 48)
    exported = GptOssStateDictAdapter.to_hf(native_state, config)
    for key, tensor in exported.items():
        assert tensor.shape == hf_state[key].shape, key
        assert tensor.data_ptr() == native_state[key].data_ptr(), key  # views, no copies
    back = GptOssStateDictAdapter.from_hf(hf_state, config)
    again = GptOssStateDictAdapter.to_hf(back, config)
    assert all(torch.equal(again[k], hf_state[k]) for k in hf_state)
    bad = {prefix + "down_proj": torch.zeros(3, 48, 32)}
    with pytest.raises(ExpertLayoutError, match="3 experts, config says 4"):
        GptOssStateDictAdapter.from_hf(bad, config)


def test_checkpoint_round_trip_is_exact(checkpoint):
    directory, hf = checkpoint
    native = AutoModelForCausalLM.from_pretrained(directory)
    assert type(native) is GptOssForCausalLM and native.tuneyard_backend == "native"
    exported = dict(native.hf_state_items())
    reference = hf.state_dict()
    assert set(exported) == set(reference)
    for key, tensor in reference.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key


# --- layers -------------------------------------------------------------------------
def test_rms_norm_matches():
    torch.manual_seed(0)
    native, hf = GptOssRMSNorm(32, eps=1e-5), hf_gpt_oss.GptOssRMSNorm(32, eps=1e-5)
    with torch.no_grad():
        hf.weight.normal_()
    native.load_state_dict(hf.state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(native(x), hf(x), atol=0, rtol=0)
    xb, native_b, hf_b = x.bfloat16(), native.bfloat16(), hf.bfloat16()
    torch.testing.assert_close(native_b(xb), hf_b(xb), atol=0, rtol=0)


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_rotary_matches(truncate):
    config = tiny_config(rope_parameters={**tiny_config().rope_parameters, "truncate": truncate})
    native, hf = RotaryEmbedding(config), hf_gpt_oss.GptOssRotaryEmbedding(config)
    positions = torch.arange(200)[None]
    x = torch.zeros(1, 200, 32)
    cos, sin = native(x, positions)
    hf_cos, hf_sin = hf(x, positions)
    half = cos.shape[-1] // 2
    for ours, theirs in ((cos, hf_cos), (sin, hf_sin)):
        torch.testing.assert_close(ours[..., :half], theirs, atol=0, rtol=0)
        torch.testing.assert_close(ours[..., half:], theirs, atol=0, rtol=0)


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("layer_idx", [0, 1])  # 0: sliding window 4, 1: full attention
@pytest.mark.parametrize("padded", [False, True])
def test_sink_attention_matches(layer_idx, padded):
    torch.manual_seed(0)
    config = tiny_config()
    hf = hf_gpt_oss.GptOssAttention(config, layer_idx).eval()
    with torch.no_grad():
        hf.sinks.normal_(0.0, 1.0)
    native = GptOssAttention(config).eval()
    native.load_state_dict(hf.state_dict())
    x = torch.randn(2, 12, 32)
    position_ids = torch.arange(12)[None].expand(2, -1)
    hf_rope = hf_gpt_oss.GptOssRotaryEmbedding(config)(x, position_ids)
    ours_rope = RotaryEmbedding(config)(x, position_ids)
    pad = torch.ones(2, 12, dtype=torch.long)
    if padded:
        pad[1, :3] = 0
    window = hf.sliding_window
    mask = build_attention_mask(pad if padded else None, None, 2, 12, x.device, window)
    assert (mask is None) == (not padded and window is None)
    full = mask if mask is not None else torch.ones(12, 12, dtype=torch.bool).tril()[None, None]
    expected, _ = hf(x, hf_rope, _additive(full.expand(2, 1, 12, 12)))
    got = native(x, ours_rope, mask)
    keep = pad.bool()
    torch.testing.assert_close(got[keep], expected[keep], **FP32)


def test_sinks_and_window_change_the_output():
    """The parity above would catch a missing sink column or window: both move the output."""
    torch.manual_seed(0)
    config = tiny_config()
    attention = GptOssAttention(config).eval()
    torch.nn.init.normal_(attention.sinks, 0.0, 1.0)
    x = torch.randn(1, 12, 32)
    rope = RotaryEmbedding(config)(x, torch.arange(12)[None])
    windowed = build_attention_mask(None, None, 1, 12, x.device, 4)
    base = attention(x, rope, windowed)
    assert not torch.allclose(base, attention(x, rope, None), atol=1e-3)
    with torch.no_grad():
        attention.sinks.fill_(-1e4)
    assert not torch.allclose(base, attention(x, rope, windowed), atol=1e-3)


def test_router_experts_and_block_match():
    torch.manual_seed(0)
    config = tiny_config()
    hf = hf_gpt_oss.GptOssMLP(config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0.0, 0.5)
    native = GptOssMoeBlock(config).eval()
    hf_state = {f"model.layers.0.mlp.{k}": v for k, v in hf.state_dict().items()}
    state = GptOssStateDictAdapter.from_hf(hf_state, config)
    native.load_state_dict({k.removeprefix("model.layers.0.mlp."): v for k, v in state.items()})
    x = torch.randn(2, 6, 32) * 3
    flat = x.reshape(-1, 32)
    logits, weights, ids = native.router(flat)
    hf_logits, hf_weights, hf_ids = hf.router(flat)
    torch.testing.assert_close(logits, hf_logits, **FP32)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, **FP32)
    projected = flat @ hf.experts.gate_up_proj[0] + hf.experts.gate_up_proj_bias[0]
    assert (projected.abs() > config.swiglu_limit).any()  # the clamps are exercised
    experts = native.experts
    assert isinstance(experts, GptOssExperts)
    torch.testing.assert_close(
        experts(flat, weights, ids), hf.experts(flat, hf_ids, hf_weights), **FP32
    )
    torch.testing.assert_close(native(x), hf(x)[0], **FP32)


# --- end to end ---------------------------------------------------------------------
def test_logits_and_loss_match_transformers(checkpoint):
    directory, hf = checkpoint
    native = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        assert_logits_and_loss_match(hf, native, token_batch(), **FP32)


def test_padded_batch_matches_on_real_tokens(checkpoint):
    directory, hf = checkpoint
    native = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        assert_padded_logits_match(hf, native, token_batch(), **FP32)


def test_load_balancing_loss_matches(checkpoint):
    directory, hf = checkpoint
    native = AutoModelForCausalLM.from_pretrained(directory, output_router_logits=True)
    ids = token_batch()
    with torch.no_grad():
        ours = native(input_ids=ids, labels=ids)
        theirs = hf(input_ids=ids, labels=ids, output_router_logits=True)
    torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, **FP32)
    torch.testing.assert_close(ours.loss, theirs.loss, **FP32)


def test_bf16_is_as_close_to_fp32_as_transformers_bf16(checkpoint):
    directory, hf = checkpoint
    ids = token_batch()
    with torch.no_grad():
        reference = hf(input_ids=ids).logits
        hf_bf16 = transformers.GptOssForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
        theirs = hf_bf16.eval()(input_ids=ids).logits.float()
        native = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
        ours = native(input_ids=ids).logits.float()
    for name in ("model.layers.0.self_attn.sinks", "model.layers.0.mlp.router.weight"):
        assert native.get_parameter(name).dtype == torch.float32, name
    assert native.model.embed_tokens.weight.dtype == torch.bfloat16
    our_error = (ours - reference).abs().max().item()
    their_error = (theirs - reference).abs().max().item()
    assert our_error <= 1.25 * their_error + 1e-3, (our_error, their_error)


def test_export_reloads_in_transformers_with_equal_logits(checkpoint, tmp_path):
    directory, _ = checkpoint
    native = AutoModelForCausalLM.from_pretrained(directory)
    native.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is transformers.GptOssForCausalLM
    ids = token_batch(seed=3)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, native(input_ids=ids).logits, atol=0, rtol=0
        )


# --- configs the native class refuses -------------------------------------------------
def test_quantized_checkpoints_fall_back_and_tied_configs_are_refused(checkpoint):
    config = tiny_config()
    config.quantization_config = {"quant_method": "mxfp4"}
    assert "MXFP4" in GptOssForCausalLM.unsupported_reason(config)
    from models.common.tie import TieWordEmbeddingsError

    with pytest.raises(TieWordEmbeddingsError, match="UNTIED_ONLY"):
        GptOssForCausalLM(tiny_config(tie_word_embeddings=True))
    native = GptOssForCausalLM(tiny_config())
    assert native.lm_head.weight is not native.model.embed_tokens.weight
