"""AutoModel's model forms read as an accepted one (jobs.recipe.automodel.blocks): the GPT-2
builder (`nanogpt_pretrain.yaml`) becomes `from_config` with a gpt2 config, whose model the
trainer builds and trains; `model.config: AutoConfig.from_pretrained(<the model's own
path>, <overrides>)` on `from_pretrained` (`nemotron_flash_*.yaml`) becomes those
overrides on the model."""

from __future__ import annotations

import pytest
import torch
from recipe_asserts import TINY_LLAMA_CONFIG, error_at

from jobs.recipe.automodel.blocks import GPT2_BUILDER, GPT2_NOTE
from trainer.builders import build_model

AUTO_CONFIG = "transformers.AutoConfig.from_pretrained"
AM_PRETRAINED = "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained"


def _gpt2(recipe, **extra):
    recipe["model"] = {"_target_": GPT2_BUILDER, "vocab_size": 128, "n_positions": 64,
                       "n_embd": 32, "n_layer": 2, "n_head": 4, "bos_token_id": 0,
                       "eos_token_id": 0, **extra}  # fmt: skip
    # nanogpt_pretrain reads token files; synthetic tokens need no tokenizer either
    recipe["dataset"] = {"_target_": "tuneyard.datasets.MockIterableDataset", "vocab_size": 128,
                         "seq_length": 32}  # fmt: skip
    recipe.pop("validation_dataset", None)
    return recipe


def test_the_gpt2_builder_becomes_from_config_and_trains(validate, recipe):
    result = validate(_gpt2(recipe, n_ctx=32, attn_implementation="flash_attention_2"))
    assert result.valid, [str(e) for e in result.errors]
    warnings = {w.loc: w.msg for w in result.warnings}
    assert warnings["model._target_"] == f"accepted: {GPT2_NOTE}"
    assert "ignored" in warnings["model.attn_implementation"]
    model = build_model(result.typed.model)
    config = model.config
    assert (config.model_type, config.n_positions, config.n_embd, config.n_layer) == (
        "gpt2", 32, 32, 2,
    )  # fmt: skip
    assert config.activation_function == "gelu"  # AutoModel's builder uses exact GELU
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    torch.manual_seed(0)
    batch = torch.randint(0, 128, (4, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8


def test_the_gpt2_builder_refuses_an_unknown_size(validate, recipe):
    error = error_at(validate(_gpt2(recipe, n_inner=64)), "model.n_inner")
    assert "takes no argument 'n_inner'" in error.msg and "n_layer" in error.fix


def _own_config(recipe, model_dir, **config):
    recipe["model"] = {"_target_": AM_PRETRAINED, "pretrained_model_name_or_path": str(model_dir),
                       "config": {"_target_": AUTO_CONFIG,
                                  "pretrained_model_name_or_path": str(model_dir), **config}}  # fmt: skip
    return recipe


def test_the_models_own_config_with_overrides_folds_into_the_model(validate, recipe, model_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA_CONFIG)).save_pretrained(model_dir)  # weights
    _own_config(recipe, model_dir, _attn_implementation="sdpa", max_position_embeddings=512)
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    kwargs = result.typed.model.kwargs
    assert "config" not in kwargs
    assert kwargs["attn_implementation"] == "sdpa" and kwargs["max_position_embeddings"] == 512
    model = build_model(result.typed.model)
    assert model.config.max_position_embeddings == 512


def test_an_override_the_config_does_not_have_is_refused_as_before(validate, recipe, model_dir):
    _own_config(recipe, model_dir, no_such_attribute=3)
    assert "no_such_attribute" in error_at(validate(recipe), "model.no_such_attribute").msg


@pytest.mark.parametrize(
    ("model_extra", "config_extra", "loc", "words"),
    [
        ({}, {"trust_remote_code": True}, "model.config.trust_remote_code", "only when the model"),
        ({"attn_implementation": "eager"}, {"_attn_implementation": "sdpa"},
         "model.config._attn_implementation", "conflicts with model.attn_implementation"),
    ],
)  # fmt: skip
def test_a_grant_or_conflict_in_the_config_is_an_error(
    validate, recipe, model_dir, model_extra, config_extra, loc, words
):
    _own_config(recipe, model_dir, **config_extra)
    recipe["model"].update(model_extra)
    assert words in error_at(validate(recipe), loc).msg


def test_another_models_config_stays_refused(validate, recipe, model_dir, tmp_path):
    _own_config(recipe, model_dir)
    recipe["model"]["config"]["pretrained_model_name_or_path"] = str(tmp_path / "other")
    error_at(validate(recipe), "model.config")
