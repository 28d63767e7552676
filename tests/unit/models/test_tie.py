"""Tied embeddings per policy (seed 000 section 2.3): alias, separation, refusals, flips."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors import safe_open
from tiny_model_configs import make_config

from models import AutoModelForCausalLM, registry
from models.common.config import ModelLoadError
from models.common.tie import TieWordEmbeddingsError
from models.llama.model import LlamaForCausalLM
from models.qwen3_moe.model import Qwen3MoeForCausalLM
from models.registry import TieSupport


class TiedOnlyLlama(LlamaForCausalLM):
    """A TIED_ONLY variant with a row of its own, to exercise that policy's runtime path."""

    architecture = "TiedOnlyLlamaForCausalLM"


@pytest.fixture
def tied_only_row():
    llama = registry.get_entry("LlamaForCausalLM")
    entry = dataclasses.replace(
        llama,
        architecture=TiedOnlyLlama.architecture,
        module=__name__,
        class_name="TiedOnlyLlama",
        tie_support=TieSupport.TIED_ONLY,
        config_model_types=(),
    )
    registry.register(entry)
    try:
        yield entry
    finally:
        registry._REGISTRY.pop(entry.architecture)


def _aliased(model) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_both_aliases_when_tied_and_separates_when_not(family):
    tied = AutoModelForCausalLM.from_config(make_config(family, tie_word_embeddings=True))
    untied = AutoModelForCausalLM.from_config(make_config(family, tie_word_embeddings=False))
    assert _aliased(tied) and not _aliased(untied)
    assert tied._tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}


def test_tie_survives_a_swapped_embedding():
    model = AutoModelForCausalLM.from_config(make_config("llama", tie_word_embeddings=True))
    model.set_input_embeddings(torch.nn.Embedding(512, 64))
    assert _aliased(model)


def test_tied_only_aliases_and_refuses_untied(tied_only_row):
    assert _aliased(TiedOnlyLlama.from_config(make_config("llama", tie_word_embeddings=True)))
    with pytest.raises(TieWordEmbeddingsError, match="TIED_ONLY"):
        TiedOnlyLlama(make_config("llama", tie_word_embeddings=False))


def test_untied_only_keeps_weights_apart_and_refuses_tied():
    model = Qwen3MoeForCausalLM.from_config(make_config("qwen3_moe"))
    assert not _aliased(model)
    with pytest.raises(TieWordEmbeddingsError, match="UNTIED_ONLY"):
        Qwen3MoeForCausalLM(make_config("qwen3_moe", tie_word_embeddings=True))


def test_tied_checkpoint_saves_one_tensor_and_reloads_tied(tmp_path):
    model = AutoModelForCausalLM.from_config(make_config("llama", tie_word_embeddings=True))
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    assert _aliased(AutoModelForCausalLM.from_pretrained(tmp_path))
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("saved", [True, False])
def test_checkpoint_flag_is_authoritative(tmp_path, saved):
    model = AutoModelForCausalLM.from_config(make_config("llama", tie_word_embeddings=saved))
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="model.tie_word_embeddings: .*authoritative"):
        AutoModelForCausalLM.from_pretrained(tmp_path, tie_word_embeddings=not saved)
    with pytest.raises(TieWordEmbeddingsError, match="authoritative"):  # the class's own guard
        LlamaForCausalLM.from_pretrained(tmp_path, tie_word_embeddings=not saved)
    same = AutoModelForCausalLM.from_pretrained(tmp_path, tie_word_embeddings=saved)
    assert _aliased(same) is saved


def test_flip_is_refused_on_the_hugging_face_path_too(tmp_path):
    AutoModelForCausalLM.from_config(make_config("llama")).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="authoritative"):
        AutoModelForCausalLM.from_pretrained(tmp_path, force_hf=True, tie_word_embeddings=True)
