"""Tiny seeded gpt-oss configs and Hugging Face reference models for the gpt-oss tests.

Two layers (sliding then full attention, window 4, so 12-token inputs are windowed), four
experts of which two are routed, YaRN RoPE with `truncate: false` as the released configs
have it, and a SwiGLU limit low enough that the clamps bite. `seeded_hf_model` draws the
biases and attention sinks at a scale where they change the logits (transformers
initialises most of them to zero).
"""

from __future__ import annotations

import torch

YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32}  # fmt: skip
VOCAB = 128


def tiny_config(**overrides):
    import transformers

    kwargs = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                  max_position_embeddings=256, pad_token_id=0, swiglu_limit=0.5,
                  rope_parameters=dict(YARN))  # fmt: skip
    return transformers.GptOssConfig(**{**kwargs, **overrides})


def seeded_hf_model(config=None, seed: int = 0):
    """transformers' GptOssForCausalLM (eager attention), biases and sinks drawn N(0, 0.5)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config or tiny_config()).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                param.normal_(0.0, 0.5)
            elif "experts" in name:
                param.normal_(0.0, 0.2)
    return model


def token_batch(batch: int = 2, seq: int = 12, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, seq), generator=generator)
