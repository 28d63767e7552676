"""The seed recipe (examples/llm_finetune/seed_003.yaml) and the shipped examples validate."""

from __future__ import annotations

from pathlib import Path

import yaml
from recipe_asserts import TINY_LLAMA_PARAMS

EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "llm_finetune"


def test_seed_003_validates_with_local_model_and_data(validate, model_dir, squad_dir):
    recipe = yaml.safe_load((EXAMPLES / "seed_003.yaml").read_text())
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    for section in ("dataset", "validation_dataset"):
        recipe[section]["path_or_dataset"] = str(squad_dir)
    recipe["dataset"]["tokenizer_name_or_path"] = str(model_dir)
    result = validate(recipe, nproc_per_node=8, accelerator="cuda")
    assert result.valid, [str(e) for e in result.errors]
    plan = result.plan
    assert plan["world_size"] == 8 and plan["dp_size"] == 8
    assert plan["grad_accumulation_steps"] == 4 and plan["global_batch_size"] == 4 * 8 * 4
    assert plan["tokens_per_step"] == plan["global_batch_size"] * 2048
    assert plan["architecture"] == "LlamaForCausalLM" and plan["param_count"] == TINY_LLAMA_PARAMS
    normalized = result.recipe
    assert normalized["step_scheduler"]["val_check_interval"] == 100
    assert normalized["restore_from"] is None and normalized["topology"]["strategy"] == "fsdp2"


def test_seed_003_validates_as_written_with_hub_names(validate):
    result = validate(EXAMPLES / "seed_003.yaml", nproc_per_node=8)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] is None  # the hub model is not cached here


def test_tiny_example_validates_with_its_assets_overridden(validate, model_dir, squad_dir):
    overrides = [
        "--model.pretrained_model_name_or_path",
        str(model_dir),
        f"--dataset.path_or_dataset={squad_dir}",
        f"validation_dataset.path_or_dataset={squad_dir}",
    ]
    result = validate(EXAMPLES / "tiny_llama_squad.yaml", overrides, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["grad_accumulation_steps"] == 1 and result.plan["max_steps"] == 20
