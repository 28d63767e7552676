"""Consolidating a native Qwen3-MoE: grouped experts go out as Hugging Face per-expert tensors.

The trainer writes every checkpoint through the model's state-dict adapter, so the
`model/` directory of a native MoE run is what transformers loads, and resuming maps it
back onto the grouped layout.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors import safe_open

from models import AutoModelForCausalLM
from trainer.checkpoint import consolidate


def _tiny_moe_config() -> transformers.Qwen3MoeConfig:
    return transformers.Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False,
    )  # fmt: skip


def test_native_moe_checkpoint_loads_in_transformers_and_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = _tiny_moe_config()
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    assert model.tuneyard_backend == "native"
    out = tmp_path / "model"
    consolidate.save_consolidated_model(model, out, is_rank0=True)

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in names
    assert not any(n.endswith("experts.down_proj") for n in names)

    ids = torch.randint(3, 512, (2, 12))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    model.eval()
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, model(ids).logits, atol=1e-5)

    torch.manual_seed(1)
    fresh = AutoModelForCausalLM.from_config(config, dtype="float32")
    consolidate.load_model_weights(fresh, out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
