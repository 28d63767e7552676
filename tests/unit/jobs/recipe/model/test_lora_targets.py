"""LoRA patterns of hybrid (Mamba/attention) families checked at submit, torch-free.

On every hybrid family, `*_proj` and `match_all_linear` select layers LoRA cannot train (a
Mamba mixer's out_proj, Jamba's dt_proj, ...): refused at the peft field with the exclusion
(or narrower targets) that fixes it, and the fixed recipe validates. A target pattern that
matches no module of the family is refused, as is an exclusion that leaves nothing; the
layer mix of the config decides what exists. Other architectures keep today's behaviour.
`test_hybrid_modules` proves each refusal against peft and the trainer themselves.
"""

from __future__ import annotations

import ast

import pytest
from hybrid_tiny_configs import CONFIGS, config_json
from recipe_asserts import error_at, write_model_dir

from jobs.recipe.model.lora_targets import lora_target_errors, lora_targets, selects

# What `*_proj` selects that LoRA cannot train, per family (the name below the layer).
PROJ_REFUSED = {
    "falcon_h1": ["mamba.out_proj"],
    "nemotron_h": ["mixer.out_proj", "mixer.fc1_latent_proj", "mixer.fc2_latent_proj"],
    "jamba": ["mamba.dt_proj"],
    "bamba": ["mamba.out_proj"],
    "granitemoehybrid": ["mamba.out_proj"],
    "zamba2": ["mamba.out_proj", "mamba_decoder.mamba.out_proj"],
    "mamba": ["mixer.x_proj", "mixer.dt_proj", "mixer.out_proj"],
    "mamba2": ["mixer.out_proj"],
    "falcon_mamba": ["mixer.x_proj", "mixer.dt_proj", "mixer.out_proj"],
}


def _hybrid(recipe: dict, data_root, model_type: str, peft: dict | None, **config) -> dict:
    model_dir = write_model_dir(data_root / model_type, config_json(model_type, **config))
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    if peft is not None:
        recipe["peft"] = {"dim": 8, "alpha": 16, **peft}
    return recipe


def _apply(recipe: dict, fix: str) -> dict:
    """The recipe with an error's fix ("set peft.<key>: [...]") applied."""
    key, _, value = fix.removeprefix("set peft.").partition(": ")
    recipe["peft"][key] = ast.literal_eval(value.split(" and ")[0])
    if " and peft.match_all_linear: false" in value:
        recipe["peft"]["match_all_linear"] = False
    return recipe


def _valid(result) -> None:
    assert result.valid, [str(e) for e in result.errors]


def test_every_family_in_the_table_has_a_case_here() -> None:
    assert set(PROJ_REFUSED) == set(CONFIGS)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_star_proj_is_refused_with_a_fix_that_validates(model_type, validate, recipe, data_root):
    recipe = _hybrid(recipe, data_root, model_type, {"target_modules": ["*_proj"]})
    error = error_at(validate(recipe), "peft.target_modules")
    assert "['*_proj']" in error.msg and "LoRA cannot train" in error.msg
    for name in PROJ_REFUSED[model_type]:
        assert name in error.msg
    _valid(validate(_apply(recipe, error.fix)))


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_all_linear_is_refused_with_a_fix_that_validates(model_type, validate, recipe, data_root):
    recipe = _hybrid(recipe, data_root, model_type, {})  # no targets: every linear layer
    error = error_at(validate(recipe), "peft.match_all_linear")
    assert "every linear layer" in error.msg and "_proj" in error.fix
    _valid(validate(_apply(recipe, error.fix)))


def test_falcon_h1_fix_excludes_the_mamba_out_proj(validate, recipe, data_root):
    recipe = _hybrid(recipe, data_root, "falcon_h1", {"target_modules": ["*_proj"]})
    error = error_at(validate(recipe), "peft.target_modules")
    assert "peft refuses LoRA on a Mamba mixer's out_proj" in error.msg
    assert error.fix == "set peft.exclude_modules: ['*.mamba.out_proj']"


def test_an_existing_exclusion_is_kept_in_the_fix(validate, recipe, data_root):
    peft = {"target_modules": ["*_proj"], "exclude_modules": ["*.self_attn.v_proj"]}
    recipe = _hybrid(recipe, data_root, "falcon_h1", peft)
    error = error_at(validate(recipe), "peft.target_modules")
    assert error.fix == "set peft.exclude_modules: ['*.self_attn.v_proj', '*.mamba.out_proj']"


def test_names_the_family_has_validate(validate, recipe, data_root):
    peft = {"target_modules": ["q_proj", "v_proj", "in_proj", "*.feed_forward.*_proj"]}
    _valid(validate(_hybrid(recipe, data_root, "falcon_h1", peft)))


def test_a_pattern_matching_no_module_is_refused(validate, recipe, data_root):
    recipe = _hybrid(recipe, data_root, "falcon_h1", {"target_modules": ["q_proj", "wqkv"]})
    error = error_at(validate(recipe), "peft.target_modules")
    assert "['wqkv'] match no module of FalconH1ForCausalLM" in error.msg
    assert "mamba.in_proj" in error.fix and "self_attn.q_proj" in error.fix


def test_the_layer_mix_decides_what_exists(validate, recipe, data_root):
    """Nemotron-H without attention blocks has no q_proj; with one, q_proj validates."""
    no_attention = {"layers_block_type": None, "hybrid_override_pattern": "M-M-"}
    recipe = _hybrid(
        recipe, data_root, "nemotron_h", {"target_modules": ["q_proj"]}, **no_attention
    )
    assert "match no module" in error_at(validate(recipe), "peft.target_modules").msg
    with_attention = {"layers_block_type": None, "hybrid_override_pattern": "M*M-"}
    _valid(validate(_hybrid(recipe, data_root, "nemotron_h", None, **with_attention)))


def test_nemotron_h_latent_projections_are_linear_when_the_config_sizes_them(
    validate, recipe, data_root
):
    peft = {"target_modules": ["*_proj"], "exclude_modules": ["*.mixer.out_proj"]}
    unsized = _hybrid(recipe, data_root, "nemotron_h", peft)
    assert "mixer.fc1_latent_proj" in error_at(validate(unsized), "peft.target_modules").msg
    _valid(validate(_hybrid(recipe, data_root, "nemotron_h", peft, moe_latent_size=8)))


def test_an_exclusion_that_leaves_nothing_is_refused(validate, recipe, data_root):
    peft = {"target_modules": ["*.self_attn.q_proj"], "exclude_modules": ["q_proj"]}
    error = error_at(
        validate(_hybrid(recipe, data_root, "falcon_h1", peft)), "peft.exclude_modules"
    )
    assert "nothing would train" in error.msg


def test_other_architectures_are_not_resolved_here(validate, recipe):
    recipe["peft"] = {"dim": 8, "target_modules": ["q_proj", "wqkv"]}  # tiny Llama
    _valid(validate(recipe))


def test_remote_code_and_another_class_name_their_own_modules() -> None:
    peft = {"target_modules": ["*_proj"]}
    config = config_json("falcon_h1")
    remote = {**config, "auto_map": {"AutoModelForCausalLM": "modeling_x.FalconH1ForCausalLM"}}
    assert lora_target_errors(remote, peft, {"trust_remote_code": True}) == []
    other = config_json("falcon_h1", architectures=["SomeRemoteFalconH1"])
    assert lora_target_errors(other, peft, {}) == []
    assert lora_target_errors(config, None, {}) == []


def test_selects_reads_patterns_as_peft_does() -> None:
    """A plain list matches by suffix; a glob the whole name, and plain names beside it
    still by suffix (the regex the trainer hands peft)."""
    name = "model.layers.3.self_attn.q_proj"
    assert selects(lora_targets(["q_proj"]), name)
    assert selects(lora_targets(["self_attn.q_proj"]), name)
    assert not selects(lora_targets(["attn.q_proj"]), name)
    assert selects(lora_targets(["*.self_attn.*"]), name)
    assert not selects(lora_targets(["self_attn*"]), name)
    assert selects(lora_targets(["lm_head", "*.k_proj", "q_proj"]), name)


def test_remote_code_without_an_auto_map_loads_transformers_class_and_is_checked() -> None:
    # The AutoModel Falcon-H1 recipes set trust_remote_code: true; with no auto_map in the
    # config transformers loads its own class, whose Mamba out_proj peft refuses.
    config = config_json("falcon_h1")
    errors = lora_target_errors(config, {"target_modules": ["*_proj"]}, {"trust_remote_code": True})
    assert [e.loc for e in errors] == ["peft.target_modules"]
