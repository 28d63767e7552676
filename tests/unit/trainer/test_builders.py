"""Builders: the allowlist table matches the real signatures; a callable refusing is a recipe error."""

from __future__ import annotations

import inspect

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.plan.requirements import importable
from jobs.recipe.targets.allowlist import TARGETS, load_callable
from jobs.recipe.typed import TargetCall
from trainer.errors import TrainerError


def _specs(trainer_only: bool):
    """Specs with a keyword table whose callable this interpreter can import (an optional
    package's callable is checked where that package is installed)."""
    specs = {
        spec.name: spec
        for spec in TARGETS.values()
        if spec.params is not None and all(importable(p) for p in spec.requires)
    }
    chosen = [s for s in specs.values() if s.import_path.startswith("trainer.") or not trainer_only]
    return sorted(chosen, key=lambda s: s.name)


def _real_params(spec) -> tuple[set[str], bool, set[str]]:
    parameters = inspect.signature(load_callable(spec)).parameters
    plain = {
        n: p
        for n, p in parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in ("self", "cls")
    }
    has_kwargs = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
    required = {n for n, p in plain.items() if p.default is p.empty}
    return set(plain), has_kwargs, required


@pytest.mark.parametrize("spec", _specs(trainer_only=True), ids=lambda s: s.name)
def test_trainer_targets_param_table_equals_the_signature(spec) -> None:
    real, _, _ = _real_params(spec)
    declared = set(spec.params) | set(spec.injected)
    if spec.kind == "dataset" and "tokenizer" in real:
        declared.add("tokenizer")  # the trainer offers it to every dataset
    assert declared == real


@pytest.mark.parametrize("spec", _specs(trainer_only=False), ids=lambda s: s.name)
def test_every_allowlisted_keyword_is_accepted_by_the_callable(spec) -> None:
    real, has_kwargs, required = _real_params(spec)
    declared = set(spec.params) | set(spec.injected)
    assert has_kwargs or declared <= real, declared - real
    supplied = set(spec.required) | set(spec.injected) | {"tokenizer"}
    assert required <= supplied, required - supplied


def test_a_callable_refusing_its_arguments_is_a_recipe_error() -> None:
    from trainer.builders import build_target

    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(TrainerError) as info:
        call = TargetCall("torch.optim.AdamW", {"lr": -1.0})
        build_target(call, "optimizer", params=params)
    assert info.value.exit_code == ExitCode.INVALID_RECIPE
    assert info.value.message.startswith("optimizer: ") and "learning rate" in info.value.message


def test_lora_target_globs_become_one_full_name_regex() -> None:
    import re

    from trainer.builders import lora_targets

    assert lora_targets(["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    pattern = lora_targets(["*_proj", "lm_head"])
    assert isinstance(pattern, str)
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head"):
        assert re.fullmatch(pattern, name), name
    assert not re.fullmatch(pattern, "model.layers.0.input_layernorm")


def test_lora_glob_wraps_the_projections_of_a_tiny_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from jobs.recipe.typed import Peft
    from trainer.builders import apply_peft

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2)  # fmt: skip
    peft = Peft(["*_proj"], None, False, 4, 8.0, 0.0, "post", False, False)
    wrapped = apply_peft(LlamaForCausalLM(config), peft)
    lora = {n.rsplit(".lora_A", 1)[0] for n, _ in wrapped.named_parameters() if ".lora_A" in n}
    assert any(n.endswith("self_attn.q_proj") for n in lora)
    assert any(n.endswith("mlp.down_proj") for n in lora)


@pytest.mark.parametrize(
    ("exclude", "spared"),
    [
        (["*.mlp.*"], "mlp."),
        (["*o_proj"], "o_proj"),
        (["model.layers.0.self_attn.*"], "self_attn."),
    ],
)
def test_lora_exclude_globs_are_read_like_target_globs(exclude, spared) -> None:
    """`exclude_modules: ["*.mlp.*"]` excludes what the glob matches (peft alone would read
    it as a name suffix and exclude nothing)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from jobs.recipe.typed import Peft
    from trainer.builders import apply_peft

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2)  # fmt: skip
    peft = Peft(["*_proj"], exclude, False, 4, 8.0, 0.0, "post", False, False)
    wrapped = apply_peft(LlamaForCausalLM(config), peft)
    lora = {n.rsplit(".lora_A", 1)[0] for n, _ in wrapped.named_parameters() if ".lora_A" in n}
    assert lora and not [n for n in lora if spared in n], sorted(lora)


def test_all_linear_lora_spares_the_output_layer_of_native_models(tiny_dir) -> None:
    from jobs.recipe.typed import Peft
    from models import AutoModelForCausalLM
    from trainer.builders import apply_peft

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    peft = Peft(None, None, True, 4, 8.0, 0.0, "post", False, False)
    wrapped = apply_peft(model, peft)
    lora = {n for n, _ in wrapped.named_parameters() if "lora_" in n}
    assert lora and not any("lm_head" in n for n in lora)
    assert any("q_proj" in n for n in lora)
