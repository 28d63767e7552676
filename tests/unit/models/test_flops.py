"""The FLOPs-per-token formula behind MFU: matmul parameters only, active experts only."""

from __future__ import annotations

from models.common.flops import model_flops_per_token
from trainer.assets import tiny_llama_config


def test_flops_formula_counts_matmul_params():
    config = tiny_llama_config()
    h, inter, v, layers, seq = 64, 128, 512, 2, 128
    attn = 2 * h * h + 2 * h * (h // 2)  # 4 heads of 16, 2 kv heads
    expected = 6 * (layers * (attn + 3 * h * inter) + h * v) + 12 * layers * 4 * 16 * seq
    assert model_flops_per_token(config, seq) == expected
    assert model_flops_per_token(config.to_dict(), seq) == expected


def test_flops_formula_counts_active_experts_only():
    dense = {
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 512,
        "intermediate_size": 128,
    }
    moe = {**dense, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    base = model_flops_per_token(dense, 16) - 6 * 3 * 64 * 128
    assert model_flops_per_token(moe, 16) == base + 6 * (64 * 8 + 2 * 3 * 64 * 32)
