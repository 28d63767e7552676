"""FLOPs and parameters of configs whose layers differ, against hand arithmetic and transformers.

A config.json's `per_layer_config` (transformers 5's heterogeneous configs), Gemma-4's own
spelling (`global_head_dim`, `num_global_key_value_heads`, `attention_k_eq_v`) and Gemma-3n's
list of MLP widths are counted layer by layer; a transformers config object whose per-layer
fields raise on a global read is counted as its dict; the projections counted equal those
Gemma-4 and Gemma-3n build; and a config whose layers are alike counts as it always did.
"""

from __future__ import annotations

import pytest

from jobs.recipe.plan.flops import (
    _attention_flops,
    flops_breakdown,
    model_flops_per_token,
    model_weights,
    param_count,
)

SEQ = 32
# 4 layers; per layer q 4x16, kv 2x16, a 128-wide gated MLP; untied 100-token head.
BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "tie_word_embeddings": False}  # fmt: skip
SLIDING_THEN_FULL = ["sliding_attention"] * 3 + ["full_attention"]
# Hand arithmetic. A sliding layer: q 64x64, k and v 32x64, o 64x64, MLP 3 x 64x128.
SLIDING_LAYER = 4096 + 2 * 2048 + 4096 + 3 * 64 * 128  # 36864 weights a token multiplies by
LM_HEAD = 100 * 64
# Attention scores: 2 x heads x (qk + v dims) x keys; a window of 8 keys on sliding layers.
SLIDING_SCORES = 2 * 4 * (16 + 16) * 8


def _training(matmul_weights: int, scores: int) -> int:
    """Full fine-tuning: 3 x forward (2 FLOPs a weight) and 3 x the score matmuls."""
    return 3 * 2 * matmul_weights + 3 * scores


def test_per_layer_config_counts_each_layer_its_own_size() -> None:
    """Layer 3 (full attention) has 32-wide heads and one kv head (Gemma-4 style)."""
    config = {**BASE, "architectures": ["SomeHeterogeneousForCausalLM"], "model_type": "some",
              "sliding_window": 8, "layer_types": SLIDING_THEN_FULL,
              "per_layer_config": {"3": {"head_dim": 32, "num_key_value_heads": 1}}}  # fmt: skip
    full_layer = 128 * 64 + 2 * 32 * 64 + 64 * 128 + 3 * 64 * 128  # q 128x64, k/v 32x64, o
    full_scores = 2 * 4 * (32 + 32) * SEQ
    expected = _training(3 * SLIDING_LAYER + full_layer + LM_HEAD, 3 * SLIDING_SCORES + full_scores)
    assert model_flops_per_token(config, SEQ) == expected == 1_039_872


def test_gemma4_config_json_widens_full_attention_and_shares_k_as_v() -> None:
    """`global_head_dim` on full-attention layers; with `attention_k_eq_v` they take their
    kv heads from `num_global_key_value_heads` and have no v_proj."""
    config = {**BASE, "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
              "sliding_window": 8, "layer_types": SLIDING_THEN_FULL, "global_head_dim": 32,
              "num_global_key_value_heads": 1, "attention_k_eq_v": True}  # fmt: skip
    full_layer = 128 * 64 + 32 * 64 + 64 * 128 + 3 * 64 * 128  # no v_proj
    full_scores = 2 * 4 * (32 + 32) * SEQ
    expected = _training(3 * SLIDING_LAYER + full_layer + LM_HEAD, 3 * SLIDING_SCORES + full_scores)
    assert model_flops_per_token(config, SEQ) == expected == 1_027_584


def test_gemma3n_counts_one_mlp_width_per_layer() -> None:
    config = {**BASE, "architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text",
              "intermediate_size": [128, 256, 128, 64], "layer_types": ["full_attention"] * 4}  # fmt: skip
    attention = 4 * (4096 + 2 * 2048 + 4096)
    mlps = 3 * 64 * (128 + 256 + 128 + 64)
    scores = 4 * 2 * 4 * (16 + 16) * SEQ
    assert model_flops_per_token(config, SEQ) == _training(attention + mlps + LM_HEAD, scores)


def test_a_layer_of_its_own_window_sees_that_many_keys() -> None:
    config = {**BASE, "sliding_window": 8, "layer_types": SLIDING_THEN_FULL,
              "per_layer_config": {"01": {"sliding_window": 4}}}  # fmt: skip
    per_key = 2 * 4 * (16 + 16)
    assert _attention_flops(config, SEQ) == per_key * (8 + 4 + 8 + SEQ)


def test_a_uniform_config_counts_as_before() -> None:
    """Hand arithmetic for the layers-alike config, with and without an empty or redundant
    `per_layer_config` (a transformers config drops overrides equal to the global value)."""
    uniform = {**BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    expected = _training(4 * SLIDING_LAYER + LM_HEAD, 4 * 2 * 4 * (16 + 16) * SEQ)
    assert model_flops_per_token(uniform, SEQ) == expected
    assert param_count(uniform) == 2 * 100 * 64 + 4 * (SLIDING_LAYER + 2 * 64) + 64
    for per_layer in ({}, {"2": {"head_dim": 16, "num_key_value_heads": 2}}):
        same = {**uniform, "per_layer_config": per_layer}
        assert model_flops_per_token(same, SEQ) == expected
        assert model_weights(same) == model_weights(uniform)


def _gemma4_config(**fields):
    from transformers import Gemma4TextConfig

    tiny = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                sliding_window=8, layer_types=SLIDING_THEN_FULL, hidden_size_per_layer_input=4,
                vocab_size_per_layer_input=100, tie_word_embeddings=False)  # fmt: skip
    return Gemma4TextConfig(**{**tiny, **fields}), {**tiny, **fields, "model_type": "gemma4_text"}


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_a_heterogeneous_transformers_config_counts_like_its_config_json(k_eq_v: bool) -> None:
    """Gemma-4's config object raises on a global `head_dim` read; it is counted, and as its
    to_dict() and as the hub's config.json spelling are."""
    from transformers.integrations.heterogeneity import AmbiguousGlobalPerLayerAttributeError

    config, raw = _gemma4_config(attention_k_eq_v=k_eq_v, num_global_key_value_heads=1)
    with pytest.raises(AmbiguousGlobalPerLayerAttributeError):
        _ = config.head_dim
    counted = flops_breakdown(config, SEQ)
    assert counted == flops_breakdown(config.to_dict(), SEQ) == flops_breakdown(raw, SEQ)
    assert counted.attention == 3 * (3 * SLIDING_SCORES + 2 * 4 * (32 + 32) * SEQ)


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _built_projections(config) -> dict[str, int]:
    from transformers import AutoModelForCausalLM

    sizes: dict[str, int] = {}
    for name, param in AutoModelForCausalLM.from_config(config).named_parameters():
        leaf = name.split(".")[-2]
        if ".layers." in name and leaf in PROJECTIONS:
            sizes[leaf] = sizes.get(leaf, 0) + param.numel()
    return sizes


def _counted_projections(config) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for weight in model_weights(config):
        leaf = weight.name.split(".")[-1]
        if leaf in PROJECTIONS:
            sizes[leaf] = sizes.get(leaf, 0) + weight.total
    return sizes


@pytest.mark.parametrize(
    "fields",
    [
        {"attention_k_eq_v": True, "num_global_key_value_heads": 1},
        {
            "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        },
    ],  # fmt: skip
    ids=["k_eq_v", "kv_shared_double_wide"],
)
def test_gemma4_projections_are_those_transformers_builds(fields: dict) -> None:
    config, raw = _gemma4_config(**fields)
    built = _built_projections(config)
    assert _counted_projections(config) == _counted_projections(raw) == built


def test_gemma3n_projections_are_those_transformers_builds() -> None:
    from transformers import Gemma3nTextConfig

    fields = dict(vocab_size=100, hidden_size=64, intermediate_size=[128, 256, 128, 64],
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2,
                  hidden_size_per_layer_input=4, vocab_size_per_layer_input=100,
                  altup_num_inputs=2, laurel_rank=4)  # fmt: skip
    built = _built_projections(Gemma3nTextConfig(**fields))
    assert _counted_projections({**fields, "model_type": "gemma3n_text"}) == built
