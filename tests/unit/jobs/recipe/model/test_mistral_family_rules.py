"""Submit-time rules for the Mistral and Mixtral rows: what validates is what was proven.

Mistral (dense, sliding window): tensor parallelism with sequence parallelism validates,
expert parallelism is refused. Mixtral (sparse): expert parallelism over the data-parallel
ranks validates; tensor parallelism and LoRA together with expert parallelism are refused
at their fields, naming the architecture.
"""

from __future__ import annotations

from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

MISTRAL = {**TINY_LLAMA_CONFIG, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
           "sliding_window": 8}  # fmt: skip
MIXTRAL = {**MISTRAL, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "num_local_experts": 4, "num_experts_per_tok": 2}  # fmt: skip


def _use(recipe, data_root, config):
    name = config["model_type"]
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / name, config)
    )


def test_mistral_tensor_parallelism_validates_and_expert_parallelism_does_not(
    validate, recipe, data_root
):
    _use(recipe, data_root, MISTRAL)
    recipe["distributed"].update(tp_size=2, sequence_parallel=True)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "MistralForCausalLM"
    recipe["distributed"].update(tp_size=1, sequence_parallel=False, ep_size=2)
    error_at(validate(recipe, nproc_per_node=2), "distributed.ep_size")


def test_mixtral_expert_parallelism_validates(validate, recipe, data_root):
    _use(recipe, data_root, MIXTRAL)
    recipe["distributed"]["ep_size"] = 2
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "MixtralForCausalLM"


def test_mixtral_tensor_parallelism_and_expert_lora_are_refused(validate, recipe, data_root):
    _use(recipe, data_root, MIXTRAL)
    recipe["distributed"]["tp_size"] = 2
    tp = error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size")
    assert "MixtralForCausalLM" in tp.msg
    recipe["distributed"].update(tp_size=1, ep_size=2)
    recipe["peft"] = {"match_all_linear": True, "dim": 8, "alpha": 16}
    result = validate(recipe, nproc_per_node=2)  # linear layers only: the experts stay frozen
    assert result.valid, [str(e) for e in result.errors]
    recipe["peft"] = {"target_modules": ["*"], "dim": 8, "alpha": 16}
    error = error_at(validate(recipe, nproc_per_node=2), "peft.target_modules")
    assert "MixtralForCausalLM" in error.msg and "'*_proj'" in error.fix
