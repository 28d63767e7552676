"""DeepSeek-V3 parity with transformers in fp32 at three levels, plus bf16 and config fallbacks.

1. A saved Hugging Face checkpoint loads natively (`models.AutoModelForCausalLM`) and saves
   back identical in names, shapes, dtypes and values (the fp32 correction bias included);
   the native export reloads in transformers with identical logits. 2. Latent attention
   (with and without a q LoRA rank, interleaved or not, YaRN mscale), the rotary tables,
   the group-limited router and the MoE block each match the transformers module. 3.
   Logits and loss match to 1e-5 (padding too); bf16 stays within bf16 tolerance with the
   router in fp32. Configs the native class cannot run fall back to transformers.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from _deepseek_v3_worker import VOCAB, YARN, seed_routers, seeded_pair, tiny_config
from safetensors.torch import load_file

from models import AutoModelForCausalLM, registry
from models.common.config import native_class_for
from models.deepseek_v3.layers import DeepseekV3MoE, GroupLimitedRouter, MLAttention
from models.deepseek_v3.model import DeepseekV3ForCausalLM
from models.registry import TieSupport

ATOL = 1e-5
VARIANTS = {
    "q_lora": {},
    "no_q_lora": {"q_lora_rank": None},
    "not_interleaved": {"rope_interleave": False},
    "yarn_mscale": {"rope_parameters": YARN},
    "one_group_unnormalised": {"n_group": 1, "topk_group": 1, "norm_topk_prob": False},
    "two_shared_experts": {"n_shared_experts": 2, "attention_bias": True},
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request) -> dict:
    return VARIANTS[request.param]


def _read_dir(directory) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def _hf_checkpoint(tmp_path, **overrides):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(tiny_config(**overrides)).eval()
    seed_routers(hf)
    hf.save_pretrained(tmp_path / "hf")
    return hf, tmp_path / "hf"


def test_from_pretrained_is_native_and_matches_transformers(variant, tmp_path):
    hf, directory = _hf_checkpoint(tmp_path, **variant)
    native = AutoModelForCausalLM.from_pretrained(directory)
    assert isinstance(native, DeepseekV3ForCausalLM) and native.tuneyard_backend == "native"
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 24))
    labels = ids.clone()
    labels[0, :4] = -100
    ref, out = hf(input_ids=ids, labels=labels), native(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, ref.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=0)


def test_checkpoint_round_trip_is_exact_and_transformers_reloads_it(tmp_path):
    _, directory = _hf_checkpoint(tmp_path)
    native = AutoModelForCausalLM.from_pretrained(directory)
    native.save_pretrained(tmp_path / "native", max_shard_size=60_000)
    before, after = _read_dir(directory), _read_dir(tmp_path / "native")
    assert sorted(before) == sorted(after)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and after[key].shape == tensor.shape, key
        assert torch.equal(after[key], tensor), key
    bias = after["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert bias.dtype is torch.float32 and bias.abs().sum() > 0
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "native").eval()
    ids = torch.randint(1, VOCAB, (2, 12))
    assert torch.equal(reloaded(input_ids=ids).logits, native(input_ids=ids).logits)


def test_padded_logits_match():
    hf, native = seeded_pair(tiny_config())
    ids = torch.randint(1, VOCAB, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ref = hf(input_ids=ids, attention_mask=mask).logits
    out = native(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], atol=ATOL, rtol=0)


def _cos_sin(hf, hidden: torch.Tensor):
    positions = torch.arange(hidden.shape[1]).unsqueeze(0).expand(hidden.shape[0], -1)
    return hf.model.rotary_emb(hidden, positions)


def test_latent_attention_matches(variant):
    hf, native = seeded_pair(tiny_config(**variant))
    ref_attn, attn = hf.model.layers[0].self_attn, native.model.layers[0].self_attn
    assert isinstance(attn, MLAttention) and attn.scaling == pytest.approx(ref_attn.scaling)
    hidden = torch.randn(2, 12, 64)
    cos_sin = _cos_sin(hf, hidden)
    ref, _ = ref_attn(hidden_states=hidden, position_embeddings=cos_sin, attention_mask=None)
    torch.testing.assert_close(attn(hidden, cos_sin), ref, atol=ATOL, rtol=0)


def test_yarn_scale_and_rotary_tables_match():
    hf, native = seeded_pair(tiny_config(rope_parameters=YARN))
    assert native.model.layers[0].self_attn.scaling != (16 + 8) ** -0.5  # mscale applied
    x, positions = torch.zeros(1, 200, 8), torch.arange(200).unsqueeze(0)
    ours, ref = native.model.rotary_emb(x, positions), hf.model.rotary_emb(x, positions)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_router_matches_and_bias_only_chooses():
    hf, native = seeded_pair(tiny_config())
    router, ref_router = native.model.layers[1].mlp.gate, hf.model.layers[1].mlp.gate
    assert isinstance(router, GroupLimitedRouter)
    flat = torch.randn(40, 64)
    logits, weights, ids = router(flat)
    ref_logits, ref_weights, ref_ids = ref_router(flat)
    order, ref_order = ids.argsort(-1), ref_ids.argsort(-1)
    assert torch.equal(ids.gather(1, order), ref_ids.gather(1, ref_order))
    torch.testing.assert_close(weights.gather(1, order), ref_weights.gather(1, ref_order))
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    with torch.no_grad():
        router.e_score_correction_bias.add_(torch.linspace(-0.3, 0.3, 8))
    _, new_weights, new_ids = router(flat)
    assert not torch.equal(new_ids.sort(-1).values, ids.sort(-1).values)  # choice moved
    scores = torch.sigmoid(logits).gather(1, new_ids)  # weights ignore the bias
    expected = scores / scores.sum(-1, keepdim=True) * 2.5
    torch.testing.assert_close(new_weights, expected, atol=1e-6, rtol=0)


def test_moe_block_and_dense_layers_match():
    hf, native = seeded_pair(tiny_config())
    block, ref_block = native.model.layers[1].mlp, hf.model.layers[1].mlp
    assert isinstance(block, DeepseekV3MoE)
    hidden = torch.randn(2, 12, 64)
    torch.testing.assert_close(block(hidden), ref_block(hidden), atol=ATOL, rtol=0)
    dense, ref_dense = native.model.layers[0], hf.model.layers[0]
    torch.testing.assert_close(dense.mlp(hidden), ref_dense.mlp(hidden), atol=ATOL, rtol=0)
    with torch.no_grad():
        ref_dense.self_attn.kv_a_layernorm.weight.uniform_(0.5, 1.5)
        dense.self_attn.kv_a_layernorm.weight.copy_(ref_dense.self_attn.kv_a_layernorm.weight)
    latent = torch.randn(2, 12, 32)
    torch.testing.assert_close(
        dense.self_attn.kv_a_layernorm(latent),
        ref_dense.self_attn.kv_a_layernorm(latent),
        atol=ATOL,
        rtol=0,
    )


def test_bf16_matches_within_tolerance_and_router_stays_fp32(tmp_path):
    hf, directory = _hf_checkpoint(tmp_path)
    hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    native = AutoModelForCausalLM.from_pretrained(directory, dtype="bfloat16")
    gate = native.model.layers[1].mlp.gate
    assert (
        gate.weight.dtype is torch.float32 and gate.e_score_correction_bias.dtype is torch.float32
    )
    assert native.model.layers[1].mlp.experts.gate_proj.dtype is torch.bfloat16
    ids = torch.randint(1, VOCAB, (2, 16))
    ref, out = hf_bf16.eval()(input_ids=ids).logits, native(input_ids=ids).logits
    assert out.dtype is torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    fp32 = hf(input_ids=ids).logits
    assert (out.float() - fp32).abs().max() < 5e-2


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"scoring_func": "softmax"}, "scoring_func"),
        ({"n_group": 3}, "n_group"),
        ({"topk_group": 5}, "topk_group"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantized"),
    ],
)
def test_configs_the_native_class_cannot_run_fall_back(overrides, reason):
    config = tiny_config()
    for key, value in overrides.items():
        setattr(config, key, value)
    native, why = native_class_for(config)
    assert native is None and reason in why


def _with_extra_shard(directory, extra: dict[str, torch.Tensor]) -> None:
    """Move the weights into a two-file sharded checkpoint whose second file is `extra`."""
    import json

    from safetensors.torch import save_file

    main = directory / "model.safetensors"
    if main.exists():
        main.rename(directory / "model-00001-of-00002.safetensors")
    save_file(extra, directory / "model-00002-of-00002.safetensors")
    weights = load_file(directory / "model-00001-of-00002.safetensors")
    weight_map = dict.fromkeys(weights, "model-00001-of-00002.safetensors")
    weight_map.update(dict.fromkeys(extra, "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def test_multi_token_prediction_layers_are_skipped_other_keys_refused(tmp_path):
    hf, directory = _hf_checkpoint(tmp_path)  # num_mtp_layers: 1, so layer 2 is MTP
    _with_extra_shard(directory, {"model.layers.2.eh_proj.weight": torch.ones(64, 128)})
    native = AutoModelForCausalLM.from_pretrained(directory)
    assert not any(k.startswith("model.layers.2.") for k, _ in native.hf_state_items())
    ids = torch.randint(1, VOCAB, (1, 8))
    torch.testing.assert_close(native(input_ids=ids).logits, hf(input_ids=ids).logits)
    _with_extra_shard(directory, {"model.layers.3.eh_proj.weight": torch.ones(2)})
    with pytest.raises(ValueError, match=r"unexpected \['model.layers.3.eh_proj.weight'\]"):
        AutoModelForCausalLM.from_pretrained(directory)


def test_registry_row_agrees_with_the_class_and_tied_configs_are_refused():
    from models.common.tie import TieWordEmbeddingsError

    entry = registry.get_entry("DeepseekV3ForCausalLM")
    assert registry.load_class(entry) is DeepseekV3ForCausalLM
    assert DeepseekV3ForCausalLM.registry_row() is entry
    assert entry.tie_support is TieSupport.UNTIED_ONLY
    assert entry.config_model_types == (tiny_config().model_type,)
    assert entry.capabilities.supports_pp and not entry.capabilities.supports_cp
    with pytest.raises(TieWordEmbeddingsError, match="UNTIED_ONLY"):
        AutoModelForCausalLM.from_config(tiny_config(tie_word_embeddings=True))
    native = AutoModelForCausalLM.from_config(tiny_config())
    assert native.lm_head.weight is not native.model.embed_tokens.weight


def test_moonlight_style_config_loads_natively_without_remote_code(tmp_path):
    """Moonlight ships DeepSeek-V3 weights with an `auto_map` to remote code and extra
    router keys; transformers' own config class reads it, and the native class runs it."""
    import json

    hf, directory = _hf_checkpoint(
        tmp_path, q_lora_rank=None, n_group=1, topk_group=1, n_shared_experts=2
    )
    config = json.loads((directory / "config.json").read_text())
    config.update(
        auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                  "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1, rope_scaling=None,
    )  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    native = AutoModelForCausalLM.from_pretrained(directory)
    assert native.tuneyard_backend == "native"
    ids = torch.randint(1, VOCAB, (2, 12))
    torch.testing.assert_close(
        native(input_ids=ids).logits, hf(input_ids=ids).logits, atol=ATOL, rtol=0
    )


def test_full_size_configs_build_on_meta_with_their_published_sizes():
    """DeepSeek-V3 (671B without its MTP layer, YaRN x40) and Moonlight (16B, no q LoRA
    rank, one group): native, parameter counts as published, TP and EP plans apply."""
    from models.hooks import ep_unsupported_reason, tp_plan, tp_unsupported_reason

    yarn = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            "rope_theta": 10000.0}  # fmt: skip
    v3 = transformers.DeepseekV3Config(rope_parameters=yarn, max_position_embeddings=163840)
    moonlight = transformers.DeepseekV3Config(
        vocab_size=163840, hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
        n_shared_experts=2, n_routed_experts=64, n_group=1, topk_group=1, num_experts_per_tok=6,
        routed_scaling_factor=2.446, first_k_dense_replace=1,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
    )  # fmt: skip
    for config, billions in ((v3, 671), (moonlight, 16)):
        assert native_class_for(config)[0] is DeepseekV3ForCausalLM
        model = DeepseekV3ForCausalLM._build_meta(config, torch.bfloat16)
        assert round(sum(p.numel() for p in model.parameters()) / 1e9) == billions
        assert tp_unsupported_reason(model, 8) is None and ep_unsupported_reason(model, 8) is None
        assert tp_plan(model, sequence_parallel=True)
    attn = DeepseekV3ForCausalLM._build_meta(v3, torch.bfloat16).model.layers[0].self_attn
    assert attn.scaling == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)
