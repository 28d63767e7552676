"""Submit-time rules for context parallelism (`distributed.cp_size > 1`).

Accepted for the architectures whose registry rows declare it (Llama, Qwen2, Qwen3), with
the mesh and plan it will run; refused, at the field to change, for architectures without
it (Qwen3-MoE, a Hugging Face fallback) and for what the trainer's context-parallel path
does not run: the Hugging Face classes (force_hf, another attention
implementation, configs with sliding windows or rope types the native class lacks),
distillation, torch.compile and expert parallelism. Tensor parallelism, LoRA and packed
sequences with cp are accepted (the torchrun runs prove them).
"""

from __future__ import annotations

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

from models.registry import capabilities_for

CP = {"cp_size": 2}


def _with_config(recipe: dict, data_root, name: str, **config) -> dict:
    model_dir = write_model_dir(data_root / name, {**TINY_LLAMA_CONFIG, **config})
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    return recipe


@pytest.mark.parametrize(
    ("architecture", "model_type"),
    [("LlamaForCausalLM", "llama"), ("Qwen2ForCausalLM", "qwen2"), ("Qwen3ForCausalLM", "qwen3")],
)
def test_cp_is_accepted_for_families_that_declare_it(
    validate, recipe, data_root, architecture, model_type
):
    assert capabilities_for(architecture).supports_cp
    _with_config(recipe, data_root, model_type, architectures=[architecture], model_type=model_type)
    recipe["distributed"].update(CP)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == architecture
    assert result.plan["cp_size"] == 2 and result.plan["dp_size"] == 1


def test_cp_with_data_parallel_ranks_is_accepted(validate, recipe):
    recipe["distributed"].update(CP)
    result = validate(recipe, nproc_per_node=4)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["cp_size"] == 2 and result.plan["dp_size"] == 2


@pytest.mark.parametrize(
    ("architecture", "model_type"),
    [("MixtralForCausalLM", "mixtral"), ("FancyForCausalLM", "fancy")],
)
def test_cp_is_refused_for_architectures_without_it(
    validate, recipe, data_root, architecture, model_type
):
    _with_config(recipe, data_root, model_type, architectures=[architecture], model_type=model_type)
    recipe["distributed"].update(CP)
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.cp_size")
    assert architecture in error.msg and "context parallelism" in error.msg
    assert "cp_size: 1" in error.fix


CONFLICTS = [
    ({"model": {"force_hf": True}}, "model.force_hf"),
    ({"model": {"attn_implementation": "eager"}}, "model.attn_implementation"),
    ({"compile": {"enabled": True}}, "compile.enabled"),
]


@pytest.mark.parametrize(("change", "loc"), CONFLICTS, ids=[c[1] for c in CONFLICTS])
def test_what_cp_does_not_run_is_refused_at_its_field(validate, recipe, change, loc):
    for section, values in change.items():
        recipe[section] = {**recipe.get(section, {}), **values}
    recipe["distributed"].update(CP)
    error = error_at(validate(recipe, nproc_per_node=2), loc)
    assert "cp_size: 1" in error.fix and loc in error.fix
    recipe["distributed"]["cp_size"] = 1  # the same recipe without cp has no such error
    assert loc not in [e.loc for e in validate(recipe, nproc_per_node=2).errors]


def test_cp_with_tensor_parallelism_or_lora_is_accepted(validate, recipe):
    recipe["distributed"].update(CP, tp_size=2, sequence_parallel=True)
    result = validate(recipe, nproc_per_node=4)
    assert result.valid, [str(e) for e in result.errors]
    assert (result.plan["cp_size"], result.plan["tp_size"], result.plan["dp_size"]) == (2, 2, 1)
    recipe["distributed"].update(tp_size=1, sequence_parallel=False)
    recipe["peft"] = {"dim": 4}
    assert validate(recipe, nproc_per_node=2).valid


def test_cp_with_packed_sequences_is_accepted(validate, recipe):
    recipe["packed_sequence"] = {"enabled": True, "packed_sequence_size": 64}
    recipe["distributed"].update(CP)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]


@pytest.mark.parametrize(("nproc", "ep"), [(2, 2), (4, 2), (4, 4)])
def test_expert_parallelism_spans_the_context_parallel_ranks(
    validate, recipe, data_root, nproc, ep
):
    """ep_size divides dp x cp (tests/integration/trainer/test_expert_parallel_layouts_run.py
    runs ep2-cp2 and ep2-dp2-cp2 equal to one process)."""
    moe = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32)  # fmt: skip
    _with_config(recipe, data_root, "moe", **moe)
    recipe["distributed"].update(CP, ep_size=ep)
    result = validate(recipe, nproc_per_node=nproc)
    assert result.valid, [str(e) for e in result.errors]


def test_expert_parallelism_must_divide_dp_times_cp(validate, recipe, data_root):
    moe = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=32)  # fmt: skip
    _with_config(recipe, data_root, "moe", **moe)
    recipe["distributed"].update(CP, ep_size=8)
    error = error_at(validate(recipe, nproc_per_node=4), "distributed.ep_size")
    assert "dp_size x cp_size (4)" in error.msg or "divisible" in error.msg, error.msg


def test_distillation_with_cp_is_refused():
    from jobs.recipe.topology.trainer_support import check_trainer_support

    errors = check_trainer_support({"recipe": "llm_kd", "distributed": CP}, "cpu")
    assert [e.loc for e in errors] == ["recipe"]
    assert check_trainer_support({"recipe": "llm_finetune", "distributed": CP}, "cpu") == []


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"sliding_window": 8}, "sliding-window"),
        ({"use_sliding_window": True, "sliding_window": 8}, "sliding-window"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
    ],
)
def test_configs_the_native_class_cannot_run_cp_are_refused(
    validate, recipe, data_root, config, reason
):
    _with_config(recipe, data_root, "windowed", **config)
    recipe["distributed"].update(CP)
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.cp_size")
    assert reason in error.msg


def test_a_qwen2_config_with_its_window_off_is_accepted(validate, recipe, data_root):
    config = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    _with_config(recipe, data_root, "qwen2", use_sliding_window=False, sliding_window=8, **config)
    recipe["distributed"].update(CP)
    assert validate(recipe, nproc_per_node=2).valid
