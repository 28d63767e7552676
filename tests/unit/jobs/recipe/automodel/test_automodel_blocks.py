"""AutoModel blocks read from another place (jobs.recipe.automodel.blocks)."""

from __future__ import annotations

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at

AM_DIST = "nemo_automodel.components.distributed.config"
MP = "torch.distributed.fsdp.MixedPrecisionPolicy"


def _warnings(result) -> dict[str, str]:
    return {w.loc: w.msg for w in result.warnings}


@pytest.mark.parametrize(("cls", "strategy"), [("FSDP2Config", "fsdp2"), ("DDPConfig", "ddp")])
def test_distributed_config_block_joins_the_distributed_section(validate, recipe, cls, strategy):
    recipe["distributed"] = {"dp_size": "none", "cp_size": 1}
    recipe["distributed_config"] = {
        "_target_": f"{AM_DIST}.{cls}",
        "activation_checkpointing": True,
    }
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.topology.strategy == strategy
    assert result.typed.topology.activation_checkpointing


def test_distributed_config_options_are_checked_like_distributed_ones(validate, recipe):
    recipe["distributed_config"] = {"_target_": f"{AM_DIST}.FSDP2Config", "sequence_paralel": True}
    assert "sequence_parallel" in error_at(validate(recipe), "distributed.sequence_paralel").fix


def test_distributed_config_conflicts_are_errors(validate, recipe):
    recipe["distributed"] = {"strategy": "ddp", "dp_size": "none"}
    recipe["distributed_config"] = {"_target_": f"{AM_DIST}.FSDP2Config"}
    error_at(validate(recipe), "distributed_config._target_")
    recipe["distributed"] = {"strategy": "fsdp2", "activation_checkpointing": False}
    recipe["distributed_config"] = {"activation_checkpointing": True}
    error_at(validate(recipe), "distributed_config.activation_checkpointing")
    recipe["distributed_config"] = {"_target_": "os.system"}
    error_at(validate(recipe), "distributed_config._target_")
    recipe["distributed_config"] = ["fsdp2"]
    error_at(validate(recipe), "distributed_config")


def test_mp_policy_target_is_the_policy(validate, recipe):
    recipe["distributed"]["mp_policy"] = {"_target_": MP, "param_dtype": "bfloat16",
                                          "reduce_dtype": "float32", "output_dtype": "bfloat16",
                                          "cast_forward_inputs": True}  # fmt: skip
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.topology.options["mp_policy"]["reduce_dtype"] == "float32"


def test_a_transformers_config_class_is_a_config_mapping(validate, recipe, model_dir):
    config = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "model_type"}
    recipe["model"] = {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config",
                       "config": {"_target_": "transformers.LlamaConfig", **config}}  # fmt: skip
    recipe["dataset"]["tokenizer_name_or_path"] = str(model_dir)  # an inline config has none
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["model"]["config"]["model_type"] == "llama"
    assert result.plan["architecture"] == "LlamaForCausalLM"
    recipe["model"]["config"] = {"_target_": "transformers.LlamaConfig", "model_type": "qwen3"}
    error_at(validate(recipe), "model.config.model_type")


def test_a_config_class_by_its_module_path_is_the_same_class(validate, recipe, model_dir):
    config = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "model_type"}
    long = "transformers.models.llama.configuration_llama.LlamaConfig"
    recipe["model"] = {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config",
                       "config": {"_target_": long, **config}}  # fmt: skip
    recipe["dataset"]["tokenizer_name_or_path"] = str(model_dir)
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["model"]["config"]["model_type"] == "llama"
    recipe["model"]["config"]["_target_"] = (
        "transformers.models.qwen2.configuration_llama.LlamaConfig"
    )
    error_at(validate(recipe), "model.config._target_")  # not a module transformers has


def test_unconsolidated_and_torch_save_checkpoints_are_warnings(validate, recipe):
    recipe["checkpoint"] = {"save_consolidated": False, "model_save_format": "torch_save"}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    warnings = _warnings(result)
    assert "consolidated Hugging Face safetensors" in warnings["checkpoint.save_consolidated"]
    assert "safetensors" in warnings["checkpoint.model_save_format"]
    assert result.typed.checkpoint.model_save_format == "safetensors"


@pytest.mark.parametrize("block", ["parallelizer", "autopipeline"])
def test_parallelizer_and_autopipeline_blocks_are_warned(validate, recipe, block):
    recipe[block] = {"_target_": "nemo_automodel.components.moe.parallelizer.parallelize_model"}
    result = validate(recipe)
    assert result.valid and _warnings(result)[block].startswith("accepted and ignored")


def test_a_benchmark_block_in_a_training_recipe_is_warned(validate, recipe):
    recipe["benchmark"] = {"warmup_steps": 10, "peak_tflops": 989}
    result = validate(recipe)
    assert result.valid and "llm_benchmark" in _warnings(result)["benchmark"]


def test_a_dataset_tokenizer_is_the_recipe_tokenizer(validate, recipe, model_dir):
    tok = {"_target_": "transformers.AutoTokenizer.from_pretrained",
           "pretrained_model_name_or_path": str(model_dir)}  # fmt: skip
    recipe["dataset"]["tokenizer"] = dict(tok)
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["tokenizer"] == tok and "tokenizer" not in result.recipe["dataset"]
    recipe["tokenizer"] = {**tok, "use_fast": False}
    error_at(validate(recipe), "dataset.tokenizer")


def test_default_collate_is_the_collater(validate, recipe):
    recipe["dataloader"] = {"collate_fn": {"_target_": "torch.utils.data.default_collate"}}
    assert validate(recipe).valid


def test_a_bare_dataset_tokenizer_is_an_auto_tokenizer(validate, recipe, model_dir):
    recipe["dataset"]["tokenizer"] = {"pretrained_model_name_or_path": str(model_dir)}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["tokenizer"]["_target_"] == "transformers.AutoTokenizer.from_pretrained"


def test_tokenizer_remote_code_follows_the_models(validate, recipe, model_dir, settings):
    from jobs.recipe.validation import validate_job

    recipe["tokenizer"] = {"_target_": "transformers.AutoTokenizer.from_pretrained",
                           "pretrained_model_name_or_path": str(model_dir),
                           "trust_remote_code": True}  # fmt: skip
    assert (
        "only when the model does" in error_at(validate(recipe), "tokenizer.trust_remote_code").msg
    )
    recipe["tokenizer"]["trust_remote_code"] = False
    assert validate(recipe).valid
    recipe["tokenizer"]["trust_remote_code"] = True
    recipe["model"]["trust_remote_code"] = True
    result = validate_job(recipe, [], None, settings, allow_remote_code=True)
    assert result.valid, [str(e) for e in result.errors]
    assert "trust_remote_code" not in result.recipe["tokenizer"]


def test_automodel_config_classes_become_transformers_own_or_are_named() -> None:
    from jobs.recipe.automodel.blocks import fold_automodel_blocks

    am = "nemo_automodel.components.models"
    loader = {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config"}
    data = {"model": {**loader, "config": {
        "_target_": f"{am}.kimi_linear.config.KimiLinear48BConfig.from_pretrained",
        "pretrained_model_name_or_path": "moonshotai/Kimi-Linear-48B-A3B-Instruct"}}}  # fmt: skip
    errors, warnings = fold_automodel_blocks(data)
    assert not errors
    assert data["model"]["config"] == {
        "_target_": "transformers.AutoConfig.from_pretrained",
        "pretrained_model_name_or_path": "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    }
    [warning] = [w for w in warnings if w.loc == "model.config._target_"]
    assert "transformers' kimi_linear configuration" in warning.msg
    data = {"model": {**loader, "config": {
        "_target_": f"{am}.deepseek_v4.config.DeepseekV4Config", "hidden_size": 64}}}  # fmt: skip
    assert fold_automodel_blocks(data)[0] == []
    assert data["model"]["config"] == {"model_type": "deepseek_v4", "hidden_size": 64}
    data = {"model": {**loader, "config": {"_target_": f"{am}.k3.config.K3Config"}}}
    [error] = fold_automodel_blocks(data)[0]
    assert error.loc == "model.config._target_"
    assert error.msg.startswith("k3 (K3Config) is not supported by tuneyard")


def test_from_config_with_the_base_weights_is_from_pretrained_of_its_path() -> None:
    """AutoModel's `from_config(AutoConfig.from_pretrained(path), load_base_model=True)`
    fine-tunes the checkpoint at `path`; a new initialisation would train another model."""
    from jobs.recipe.automodel.blocks import fold_automodel_blocks

    loader = "nemo_automodel.NeMoAutoModelForCausalLM"
    config = {"_target_": "transformers.AutoConfig.from_pretrained",
              "pretrained_model_name_or_path": "org/model", "max_position_embeddings": 64}  # fmt: skip
    data = {
        "model": {"_target_": f"{loader}.from_config", "config": config, "load_base_model": True}
    }
    errors, warnings = fold_automodel_blocks(data)
    assert not errors
    assert data["model"] == {"_target_": f"{loader}.from_pretrained",
                             "pretrained_model_name_or_path": "org/model",
                             "max_position_embeddings": 64}  # fmt: skip
    [warning] = [w for w in warnings if w.loc == "model.load_base_model"]
    assert "from_pretrained of 'org/model'" in warning.msg
    inline = {"_target_": f"{loader}.from_config", "config": {"model_type": "llama"},
              "load_base_model": True}  # fmt: skip
    [error] = fold_automodel_blocks({"model": inline})[0]
    assert error.loc == "model.load_base_model" and "reads no checkpoint" in error.msg
    for target, value, why in (("from_config", False, "new initialisation"),
                               ("from_pretrained", True, "always loads the base weights")):  # fmt: skip
        data = {"model": {"_target_": f"{loader}.{target}", "load_base_model": value}}
        errors, warnings = fold_automodel_blocks(data)
        assert not errors and "load_base_model" not in data["model"]
        assert why in next(w.msg for w in warnings if w.loc == "model.load_base_model")
