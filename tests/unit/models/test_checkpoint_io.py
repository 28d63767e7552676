"""Safetensors loading and saving: shards, dtype conversion, in-place reads and its errors."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_model_configs import make_config

from models import AutoModelForCausalLM
from models.auto import ModelLoadError
from models.common.checkpoint_io import (
    CheckpointError,
    SafetensorsReader,
    checkpoint_files,
    save_safetensors,
)
from models.llama.model import LlamaForCausalLM


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config("llama"))
    model.save_pretrained(tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


def test_sharded_save_writes_an_index_transformers_reads(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config("qwen3_moe"))
    model.save_pretrained(tmp_path, max_shard_size=50_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(checkpoint_files(tmp_path)) > 2
    assert set(index["weight_map"]) == set(model.hf_load_targets())
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(1, 512, (1, 10))
    torch.testing.assert_close(model(input_ids=ids).logits, hf(input_ids=ids).logits)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)


def test_reads_land_in_the_parameters_own_storage(saved):
    model, directory = saved
    fresh = AutoModelForCausalLM.from_config(make_config("llama"))
    param = fresh.model.layers[0].self_attn.q_proj.weight
    pointer = param.data_ptr()
    with SafetensorsReader(directory) as reader:
        reader.read_into("model.layers.0.self_attn.q_proj.weight", param.data)
    assert param.data_ptr() == pointer
    assert torch.equal(param, model.model.layers[0].self_attn.q_proj.weight)


def test_checkpoint_dtype_converts_on_load(saved):
    model, directory = saved
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype="bfloat16")
    weight = loaded.model.embed_tokens.weight
    assert weight.dtype is torch.bfloat16
    assert torch.equal(weight, model.model.embed_tokens.weight.to(torch.bfloat16))
    assert not loaded.training  # from_pretrained returns eval mode, as transformers does


def test_missing_and_unexpected_keys_are_refused(saved):
    _, directory = saved
    tensors = load_file(directory / "model.safetensors")
    tensors.pop("model.norm.weight")
    tensors["model.extra.weight"] = torch.zeros(2)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"missing \['model.norm.weight'\].*unexpected"):
        AutoModelForCausalLM.from_pretrained(directory)


def test_shape_mismatch_is_refused(saved, tmp_path):
    _, directory = saved
    bigger = AutoModelForCausalLM.from_config(make_config("llama", intermediate_size=256))
    bigger.save_pretrained(tmp_path / "big")
    (directory / "model.safetensors").replace(tmp_path / "theirs.safetensors")
    (tmp_path / "big" / "model.safetensors").replace(directory / "model.safetensors")
    with pytest.raises(ModelLoadError, match="pretrained_model_name_or_path: .*checkpoint shape"):
        AutoModelForCausalLM.from_pretrained(directory)
    with pytest.raises(CheckpointError, match="checkpoint shape"):  # the native class itself
        LlamaForCausalLM.from_pretrained(directory)


def test_missing_shard_and_empty_directory(tmp_path):
    save_safetensors(
        tmp_path / "s", [("a", torch.ones(4)), ("b", torch.ones(4))], max_shard_bytes=16
    )
    (tmp_path / "s" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        checkpoint_files(tmp_path / "s")
    (tmp_path / "e").mkdir()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        checkpoint_files(tmp_path / "e")


def test_written_files_match_the_safetensors_library(tmp_path):
    tensors = {
        "f": torch.randn(3, 5),
        "b": torch.randn(7).to(torch.bfloat16),
        "i": torch.arange(6).reshape(2, 3),
        "z": torch.zeros(0),
    }
    save_safetensors(tmp_path, tensors.items())
    back = load_file(tmp_path / "model.safetensors")
    for key, tensor in tensors.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor)
