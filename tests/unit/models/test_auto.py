"""The loader: native-vs-HF choice, dtype handling, config inputs and its user errors."""

from __future__ import annotations

import pytest
import torch

from cli.demo_assets import tiny_llama_config
from models import AutoModelForCausalLM
from models.common.config import ModelLoadError, native_class_for, resolve_dtype


def test_dtype_names_resolve():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(None, "torch.float16") is torch.float16
    assert resolve_dtype(torch.float32) is torch.float32
    assert resolve_dtype("auto") == "auto" and resolve_dtype() is None


def test_unknown_dtype_names_the_field():
    with pytest.raises(ModelLoadError, match="model.dtype: unknown dtype 'float8'"):
        resolve_dtype("float8")


def test_from_config_accepts_dict_object_and_path(tiny_llama_dir):
    as_dict = {**tiny_llama_config().to_dict(), "model_type": "llama"}
    for config in (tiny_llama_config(), as_dict, str(tiny_llama_dir)):
        model = AutoModelForCausalLM.from_config(config, dtype="bfloat16")
        assert model.config.hidden_size == 64
        assert model.model.embed_tokens.weight.dtype is torch.bfloat16


def test_dict_config_without_model_type_is_refused():
    with pytest.raises(ModelLoadError, match="model_type"):
        AutoModelForCausalLM.from_config({"hidden_size": 64})


def test_force_hf_gives_transformers_class(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, force_hf=True)
    assert model.tuneyard_backend == "hf"
    assert type(model).__module__.startswith("transformers.")


def test_unregistered_architecture_falls_back_to_hf():
    from transformers import GPT2Config

    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)
    assert native_class_for(config)[0] is None
    model = AutoModelForCausalLM.from_config(config)
    assert model.tuneyard_backend == "hf"


def test_missing_directory_and_uncached_hub_id(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a model directory"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        AutoModelForCausalLM.from_pretrained("no-such-org/no-such-model")
    with pytest.raises(ModelLoadError, match="has no config.json"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_configs_native_cannot_run_fall_back_with_a_reason():
    from tiny_model_configs import make_config

    dynamic = make_config(
        "llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    )
    assert "rope_type 'dynamic'" in native_class_for(dynamic)[1]
    assert AutoModelForCausalLM.from_config(dynamic).tuneyard_backend == "hf"
    sliding = make_config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert native_class_for(sliding)[1] == "native Qwen2ForCausalLM"  # windows run natively
    flash = native_class_for(make_config("llama"), "flash_attention_2")
    assert flash[0] is None and "flash_attention_2" in flash[1]


def test_broken_native_import_falls_back_to_hf(monkeypatch):
    from models import registry

    entry = registry.get_entry("LlamaForCausalLM")
    monkeypatch.setitem(
        registry._REGISTRY,
        "LlamaForCausalLM",
        registry.ArchEntry(**{**entry.__dict__, "module": "models.nope"}),
    )
    cls, why = native_class_for(tiny_llama_config(architectures=["LlamaForCausalLM"]))
    assert cls is None and "failed to import" in why


def test_auto_config_applies_overrides_and_refuses_unknown_attributes(tiny_llama_dir):
    from models.auto import auto_config

    config = auto_config(str(tiny_llama_dir), num_hidden_layers=1)
    assert config.num_hidden_layers == 1 and config.model_type == "llama"
    model = AutoModelForCausalLM.from_config(config)
    assert len(model.model.layers) == 1
    with pytest.raises(ModelLoadError) as info:
        auto_config(str(tiny_llama_dir), num_hiden_layers=1)
    assert info.value.field == "model.config.num_hiden_layers"


def test_multimodal_checkpoint_without_a_causal_lm_class_loads_its_text_path(tmp_path):
    """Mistral-Small-3.x (`Mistral3ForConditionalGeneration`) has no causal-LM class: the
    image-text-to-text one is built, runs on text alone, and trains only its text path."""
    from transformers import Mistral3Config

    text = dict(model_type="mistral", hidden_size=32, intermediate_size=64, head_dim=8)
    text |= dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, head_dim=8)
    vision |= dict(num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=8)
    config = Mistral3Config(
        text_config={**text, "vocab_size": 96}, vision_config=vision, spatial_merge_size=1
    )
    model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == "Mistral3ForConditionalGeneration"
    named = model.named_parameters(remove_duplicate=False)
    parts = {(n.split(".")[1] if n.startswith("model.") else n, p.requires_grad) for n, p in named}
    assert parts == {
        ("language_model", True),
        ("lm_head.weight", True),
        ("vision_tower", False),
        ("multi_modal_projector", False),
    }
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    logits = loaded(input_ids=torch.tensor([[1, 5, 7]])).logits
    assert logits.shape == (1, 3, 96)
