"""Consolidating a native Phi-3: split q/k/v and gate/up go out fused, as transformers loads.

The trainer gathers each conversion group (`models.hooks.to_hf_groups`: the parts of one
fused tensor) and writes the fused tensor, synchronously and through the asynchronous
snapshot, plain and FSDP2-sharded; resuming maps the fused directory back onto the split
parameters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from models import AutoModelForCausalLM
from trainer.checkpoint import consolidate


def _tiny_phi3_config(**overrides) -> transformers.Phi3Config:
    kwargs = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, partial_rotary_factor=0.5,
    )  # fmt: skip
    return transformers.Phi3Config(**{**kwargs, **overrides})


def _native(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_tiny_phi3_config(**overrides), dtype="float32")
    assert model.tuneyard_backend == "native"
    return model.eval()


def _assert_transformers_matches(model, out: Path) -> None:
    names = set()
    for path in out.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            names |= set(f.keys())
    assert "model.layers.1.self_attn.qkv_proj.weight" in names
    assert "model.layers.1.mlp.gate_up_proj.weight" in names
    assert not any(".q_proj." in n or ".gate_proj." in n for n in names)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(3, 128, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tied", [False, True])
def test_consolidated_phi3_loads_in_transformers_and_back(tmp_path: Path, tied: bool) -> None:
    model = _native(tie_word_embeddings=tied)
    out = tmp_path / "model"
    consolidate.save_consolidated_model(model, out, is_rank0=True, max_shard_bytes=50_000)
    _assert_transformers_matches(model, out)
    fresh = _native(seed=1, tie_word_embeddings=tied)
    consolidate.load_model_weights(fresh, out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


def test_async_snapshot_of_phi3_is_private_and_fused(tmp_path: Path) -> None:
    model = _native()
    snapshot = consolidate.snapshot_consolidated_model(model, is_rank0=True)
    expected = {n: t.clone() for n, t in model.state_dict().items()}
    with torch.no_grad():  # the step loop goes on: the snapshot must not see this
        for param in model.parameters():
            param.add_(1.0)
    consolidate.write_consolidated_snapshot(snapshot, tmp_path / "model")
    model.load_state_dict(expected)
    _assert_transformers_matches(model, tmp_path / "model")


def test_fsdp_sharded_phi3_consolidates(tmp_path: Path, single_rank_group) -> None:
    from torch.distributed.fsdp import fully_shard

    from models.hooks import decoder_layers

    model = _native()
    reference = _native()
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    consolidate.save_consolidated_model(model, tmp_path / "model", is_rank0=True)
    _assert_transformers_matches(reference, tmp_path / "model")
