"""Build the tiny gpt-oss `tiny_gpt_oss_ep.yaml` reads, under .tuneyard/assets/tiny_gpt_oss.

A seeded two-layer gpt-oss (sliding then full attention, 4 biased experts, attention
sinks, YaRN) with its BPE tokenizer, made from nothing (no hub access). The SQuAD-format
set comes from `build_tiny_assets.py`. Run from the repository root:
    python3 examples/llm_finetune/build_tiny_assets.py
    python3 examples/llm_finetune/build_tiny_gpt_oss.py
"""

from __future__ import annotations

from pathlib import Path

TINY_GPT_OSS = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=256,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    },
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def build_tiny_gpt_oss(directory: Path, seed: int = 0) -> Path:
    """Save a seeded tiny gpt-oss (safetensors + config.json) and a tokenizer in one dir."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from cli.demo_assets import build_tokenizer

    build_tokenizer(directory, vocab_size=TINY_GPT_OSS["vocab_size"])
    torch.manual_seed(seed)
    GptOssForCausalLM(GptOssConfig(**TINY_GPT_OSS)).save_pretrained(directory)
    return directory


if __name__ == "__main__":
    print(f"wrote {build_tiny_gpt_oss(Path('.tuneyard/assets/tiny_gpt_oss'))}")
