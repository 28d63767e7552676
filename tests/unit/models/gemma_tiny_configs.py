"""Tiny seeded Gemma 2 / Gemma 3 text configs for the Gemma tests (~60k parameters).

Two layers, one "sliding_attention" (window 8, shorter than the test sequences) and one
"full_attention"; `query_pre_attn_scalar` differs from `head_dim` so the scaling is seen;
Gemma 2's soft-caps are small enough to bend tiny logits; Gemma 3 has distinct local and
global RoPE bases (linear scaling on the global one). `randomize_norms` moves every Gemma
RMSNorm weight off zero so (1 + weight) is exercised, and scales q/k projections up so
attention scores reach the soft-cap.
"""

from __future__ import annotations

import torch

GEMMA_FAMILIES = ["gemma2", "gemma3"]
VOCAB = 128
HIDDEN = 64
WINDOW = 8
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
              query_pre_attn_scalar=24, sliding_window=WINDOW, pad_token_id=0,
              layer_types=["sliding_attention", "full_attention"])  # fmt: skip
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}  # fmt: skip


def gemma_config(family: str, **overrides):
    import transformers

    if family == "gemma2":
        kwargs = dict(COMMON, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
        return transformers.Gemma2Config(**{**kwargs, **overrides})
    kwargs = dict(COMMON, rope_parameters=GEMMA3_ROPE, final_logit_softcapping=3.0)
    return transformers.Gemma3TextConfig(**{**kwargs, **overrides})


def randomize_norms(model: torch.nn.Module, seed: int = 3) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.rand(param.shape, generator=generator) - 0.5)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(10.0)
