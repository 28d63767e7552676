"""AutoModel keys with no effect here: checked, dropped, each with a warning saying why
(jobs.recipe.automodel.inert), and top-level `_` keys (jobs.recipe.automodel.sections)."""

from __future__ import annotations

from typing import Any

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Recipe

PEFT = {"target_modules": ["q_proj", "v_proj"], "dim": 4, "alpha": 8}


def _warning(result, loc: str) -> str:
    found = [w.msg for w in result.warnings if w.loc == loc]
    assert found, f"no warning at {loc}: {[str(w) for w in result.warnings]}"
    return found[0]


def _valid(result):
    assert result.valid, [str(e) for e in result.errors]
    return result


@pytest.mark.parametrize(
    ("section", "key", "value", "words"),
    [
        ("step_scheduler", "loss_average_window_steps", 5, "bi-encoder recipe averages"),
        ("packed_sequence", "num_proc", 1, "tokenizes once into the datasets cache"),
        ("peft", "use_memory_efficient_lora", True, "only saves activation memory"),
    ],
)
def test_an_inert_key_is_accepted_with_why(validate, recipe, section, key, value, words):
    recipe.setdefault(section, dict(PEFT) if section == "peft" else {})[key] = value
    result = _valid(validate(recipe))
    msg = _warning(result, f"{section}.{key}")
    assert msg.startswith("accepted and ignored: ") and words in msg
    assert key not in str(result.recipe)  # the stored recipe never carries it


@pytest.mark.parametrize(
    ("section", "key", "value", "words"),
    [
        ("step_scheduler", "loss_average_window_steps", 0, "integer from 1"),
        ("step_scheduler", "loss_average_window_steps", "50", "integer from 1"),
        ("packed_sequence", "num_proc", 10**6, "integer from 1 to 256"),
        ("peft", "use_memory_efficient_lora", "yes", "true or false"),
    ],
)
def test_an_inert_key_with_a_value_automodel_refuses_is_an_error(
    validate, recipe, section, key, value, words
):
    recipe.setdefault(section, dict(PEFT) if section == "peft" else {})[key] = value
    assert words in error_at(validate(recipe), f"{section}.{key}").msg


def test_memory_efficient_lora_off_is_tuneyards_lora_and_needs_no_warning(validate, recipe):
    recipe["peft"] = {**PEFT, "use_memory_efficient_lora": False}
    result = _valid(validate(recipe))
    assert "peft.use_memory_efficient_lora" not in [w.loc for w in result.warnings]


def _pipelined(recipe: dict[str, Any], **pipeline: Any) -> dict[str, Any]:
    recipe["distributed"] = {"strategy": "fsdp2", "pp_size": 2,
                             "pipeline": {"pp_schedule": "1f1b", "pp_microbatch_size": 1,
                                          **pipeline}}  # fmt: skip
    return recipe


def test_pp_seq_len_is_a_hint_tuneyard_does_not_need(validate, recipe):
    result = _valid(validate(_pipelined(recipe, pp_seq_len=64), nproc_per_node=2))
    msg = _warning(result, "distributed.pipeline.pp_seq_len")
    assert "for the batch's own shape" in msg
    assert "pp_seq_len" not in result.typed.topology.pipeline.section


def test_pp_seq_len_null_is_automodels_default_and_needs_no_warning(validate, recipe):
    result = _valid(validate(_pipelined(recipe, pp_seq_len=None), nproc_per_node=2))
    assert "distributed.pipeline.pp_seq_len" not in [w.loc for w in result.warnings]


def test_a_negative_pp_seq_len_is_an_error(validate, recipe):
    result = validate(_pipelined(recipe, pp_seq_len=-8), nproc_per_node=2)
    assert "integer from 1" in error_at(result, "distributed.pipeline.pp_seq_len").msg


def test_a_top_level_autocast_section_is_read_by_no_llm_recipe(validate, recipe):
    recipe["autocast"] = {"enabled": True, "dtype": "bfloat16"}
    msg = _warning(_valid(validate(recipe)), "autocast")
    assert "read no top-level autocast section" in msg


def test_autocast_none_is_no_section_and_a_scalar_is_an_error(validate, recipe):
    recipe["autocast"] = "none"
    assert "autocast" not in [w.loc for w in _valid(validate(recipe)).warnings]
    recipe["autocast"] = True
    assert "must be a mapping" in error_at(validate(recipe), "autocast").msg


YAML_WITH_ANCHORS = """
_chat_template: &tpl "{{ messages }}"
_validation_dataset:
  _target_: os.system
  command: rm -rf /
step_scheduler: {max_steps: 4, global_batch_size: 8}
model:
  _target_: tuneyard.models.AutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: MODEL
dataset:
  _target_: tuneyard.datasets.SquadDataset
  path_or_dataset: SQUAD
  max_seq_length: 64
dataloader: {batch_size: 4}
optimizer: {_target_: torch.optim.AdamW, lr: 1.0e-3}
"""


def test_underscore_sections_hold_anchors_and_are_never_read(validate, model_dir, squad_dir):
    """AutoModel reads sections by name; a `_` key's `_target_` is never even checked."""
    text = YAML_WITH_ANCHORS.replace("MODEL", str(model_dir)).replace("SQUAD", str(squad_dir))
    result = _valid(validate(text))
    for key in ("_chat_template", "_validation_dataset"):
        assert "only holds YAML anchors" in _warning(result, key)
    assert "_validation_dataset" not in result.recipe
    assert Recipe.from_json(result.recipe).validation_dataset is None


def test_a_top_level_target_is_not_an_anchor_holder(validate, recipe):
    recipe["_target_"] = "os.system"
    assert "unknown section" in error_at(validate(recipe), "_target_").msg
