"""Tiny seeded configs for every native family (shared by the model tests; ~100k params)."""

from __future__ import annotations

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              pad_token_id=0)  # fmt: skip
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}  # fmt: skip
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 64}  # fmt: skip
FAMILIES = ["llama", "llama3_rope", "yarn_rope", "qwen2", "qwen3", "qwen3_moe"]


def make_config(family: str, **overrides):
    """A ~100k-parameter config of each family (fp32), tied or not via overrides."""
    import transformers

    kwargs = dict(COMMON)
    if family == "llama3_rope":
        kwargs["rope_parameters"] = LLAMA3_ROPE
    if family == "yarn_rope":
        kwargs["rope_parameters"] = YARN_ROPE
    if family in ("llama", "llama3_rope", "yarn_rope"):
        return transformers.LlamaConfig(**{**kwargs, **overrides})
    if family == "qwen2":
        return transformers.Qwen2Config(**{**kwargs, **overrides})
    if family == "qwen3":
        return transformers.Qwen3Config(head_dim=32, **{**kwargs, **overrides})
    moe = dict(
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    )
    return transformers.Qwen3MoeConfig(**{**kwargs, **moe, **overrides})


def hf_to_native_state(hf_state: dict) -> dict:
    """Transformers' in-memory Qwen3-MoE experts are fused gate_up; split to native names."""
    out = {}
    for key, value in hf_state.items():
        if key.endswith("experts.gate_up_proj"):
            gate, up = value.chunk(2, dim=1)
            out[key.replace("gate_up_proj", "gate_proj")] = gate
            out[key.replace("gate_up_proj", "up_proj")] = up
        else:
            out[key] = value
    return out
