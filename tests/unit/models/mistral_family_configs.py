"""Tiny seeded Mistral and Mixtral configs for the Mistral-family tests (fp32, ~50k params).

The sliding window (6) is shorter than the test sequences (16-24 tokens), so every parity
check crosses it; `sliding_window=None` overrides give the plain causal stack. The checks the
family tests share with the other families (a saved directory's tensors, a few AdamW steps,
LoRA, round trip) live in `family_checks`.
"""

from __future__ import annotations

VOCAB = 128
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=128, pad_token_id=0, sliding_window=6)  # fmt: skip
MOE = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)


def mistral_config(**overrides):
    import transformers

    config = transformers.MistralConfig(**{**COMMON, **overrides})
    config._attn_implementation = "sdpa"
    return config


def mixtral_config(**overrides):
    import transformers

    config = transformers.MixtralConfig(**{**COMMON, **MOE, **overrides})
    config._attn_implementation = "sdpa"
    return config


def make_family_config(family: str, **overrides):
    return {"mistral": mistral_config, "mixtral": mixtral_config}[family](**overrides)
