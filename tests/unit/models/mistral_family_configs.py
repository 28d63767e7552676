"""Tiny seeded Mistral and Mixtral configs for the Mistral-family tests (fp32, ~50k params).

The sliding window (6) is shorter than the test sequences (16-24 tokens), so every parity
check crosses it; `sliding_window=None` overrides give the plain causal stack. Also the two
helpers the parity tests share: reading a saved directory's tensors and a few AdamW steps.
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


def read_safetensors_dir(directory) -> dict:
    """Every tensor of every safetensors file in a saved model directory."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def train_losses(model, ids, steps: int = 8, lr: float = 3e-3) -> list[float]:
    """AdamW steps on one batch; asserts every trainable parameter gets a gradient."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is not None for p in trainable)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
