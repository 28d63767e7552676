"""Gemma 2 / Gemma 3 text: training, LoRA, tie policy, registry rows and HF fallbacks.

A few AdamW steps lower the loss (every parameter gets a gradient); LoRA through the
trainer's `apply_peft` trains only the adapters, and the saved adapter applied to the
transformers class gives the same logits; TIED_ONLY aliases lm_head and refuses untied
configs; the registry rows agree with the classes; configs the native classes cannot
run (bidirectional attention, Gemma 3 attention soft-capping, another activation) and the
multimodal `Gemma3ForConditionalGeneration` load with Hugging Face.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import (
    assert_lora_trains_adapters_and_applies_to_hf,
    assert_registry_row_agrees,
    fixed_batch,
    train_losses,
)
from gemma_tiny_configs import GEMMA_FAMILIES, VOCAB, gemma_config, randomize_norms

from models import AutoModelForCausalLM, registry
from models.common.config import native_class_for
from models.common.tie import TieWordEmbeddingsError
from models.hooks import decoder_layers, parallel_plan, supports_tp
from models.registry import TieSupport

ARCHITECTURES = {"gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
MODEL_TYPES = {"gemma2": "gemma2", "gemma3": "gemma3_text"}


@pytest.fixture(params=GEMMA_FAMILIES)
def gemma(request) -> str:
    return request.param


def test_loss_falls_and_every_parameter_gets_a_gradient(gemma):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(gemma_config(gemma)).train()
    assert all(not p.any() for n, p in model.named_parameters() if "norm" in n)  # 1 + 0
    losses = train_losses(model, fixed_batch(VOCAB))
    assert losses[-1] < losses[0] - 0.5, losses
    assert len(decoder_layers(model)) == 2


def test_lora_trains_adapters_only_and_the_adapter_applies_to_transformers(gemma, tmp_path):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(gemma_config(gemma))
    randomize_norms(hf)
    hf.save_pretrained(tmp_path / "base")
    ids = fixed_batch(VOCAB)
    compare_ids = torch.randint(1, VOCAB, (2, 20))
    trainable = assert_lora_trains_adapters_and_applies_to_hf(
        tmp_path / "base", tmp_path / "adapter", ids, compare_ids, steps=8, lr=1e-2
    )
    assert not any("lm_head" in n for n in trainable)


def test_tied_only_aliases_and_refuses_untied(gemma):
    model = AutoModelForCausalLM.from_config(gemma_config(gemma))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cls = registry.load_class(registry.get_entry(ARCHITECTURES[gemma]))
    with pytest.raises(TieWordEmbeddingsError, match="TIED_ONLY"):
        cls(gemma_config(gemma, tie_word_embeddings=False))


def test_registry_row_agrees_with_the_class(gemma):
    assert MODEL_TYPES[gemma] == gemma_config(gemma).model_type
    entry, cls = assert_registry_row_agrees(ARCHITECTURES[gemma], gemma, MODEL_TYPES[gemma])
    assert entry.tie_support is TieSupport.TIED_ONLY
    caps = entry.capabilities
    assert caps.supports_tp and caps.supports_sequence_parallel and caps.supports_lora
    assert not (caps.supports_pp or caps.supports_cp or caps.supports_ep)
    assert entry.state_dict_adapter is None and cls.state_dict_adapter() is None
    model = AutoModelForCausalLM.from_config(gemma_config(gemma))
    assert parallel_plan(model) is registry.load_parallel_plan(entry)
    assert supports_tp(model, 2) and not supports_tp(model, 4)  # 2 kv heads


def test_hf_class_of_the_family_gets_the_family_plan(gemma):
    hf = AutoModelForCausalLM.from_config(gemma_config(gemma), force_hf=True)
    assert hf.tuneyard_backend == "hf"
    assert parallel_plan(hf) is registry.load_parallel_plan(
        registry.get_entry(ARCHITECTURES[gemma])
    )


@pytest.mark.parametrize(
    ("family", "overrides", "reason"),
    [
        ("gemma2", {"use_bidirectional_attention": True}, "bidirectional"),
        ("gemma3", {"use_bidirectional_attention": True}, "bidirectional"),
        ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ("gemma2", {"hidden_activation": "relu"}, "hidden_activation"),
        ("gemma2", {"layer_types": ["chunked_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_configs_the_native_class_cannot_run_load_with_hf(family, overrides, reason):
    config = gemma_config(family, **overrides)
    cls, why = native_class_for(config)
    assert cls is None and reason in why
    model = AutoModelForCausalLM.from_config(config)
    assert model.tuneyard_backend == "hf"


def test_multimodal_gemma3_is_not_native():
    config = transformers.Gemma3Config(text_config=gemma_config("gemma3").to_dict())
    config.architectures = ["Gemma3ForConditionalGeneration"]
    cls, why = native_class_for(config)
    assert cls is None and "not registered" in why
    assert registry.get_entry("Gemma3ForConditionalGeneration") is None
    assert registry.entry_for_model_type("gemma3") is None
    caps = registry.capabilities_for("Gemma3ForConditionalGeneration")
    assert caps == registry.HF_FALLBACK_CAPABILITIES


def test_context_parallel_is_refused_by_the_attention(gemma):
    model = AutoModelForCausalLM.from_config(
        gemma_config(gemma, layer_types=["full_attention"] * 2)
    )
    attention = model.model.layers[0].self_attn
    attention.context_parallel = object()
    with pytest.raises(ValueError, match="context parallel"):
        model(input_ids=torch.randint(1, VOCAB, (1, 8)))
    assert not registry.get_entry(ARCHITECTURES[gemma]).capabilities.supports_cp


def test_models_deep_copy_and_pickle(gemma):
    """Gemma 3's per-layer-type RoPE config view survives copy and pickle (no recursion)."""
    import copy
    import pickle

    model = AutoModelForCausalLM.from_config(gemma_config(gemma)).eval()
    ids = torch.randint(1, VOCAB, (1, 12))
    logits = model(input_ids=ids).logits
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(clone(input_ids=ids).logits, logits)
