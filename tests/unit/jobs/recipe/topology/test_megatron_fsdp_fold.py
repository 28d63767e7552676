"""A megatron_fsdp recipe runs as FSDP2 (`jobs.recipe.topology.megatron_fsdp`): checked by
megatron_fsdp's topology rules, then planned and stored as fsdp2, with one warning at
distributed.strategy saying so and the options mapped or named as without effect.
(tests/integration/trainer/test_megatron_fsdp_run.py runs one on 2 gloo ranks.)"""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.topology.megatron_fsdp import RUNS_AS_FSDP2, as_fsdp2
from jobs.recipe.topology.setup import (
    DistributedSetup,
    FSDP2Config,
    MegatronFSDPConfig,
    ParallelismSizes,
)

AM = "nemo_automodel.components.distributed"
SPELLINGS = {
    "strategy": {"distributed": {"strategy": "megatron_fsdp"}},
    "alias": {"distributed": {"strategy": "mfsdp"}},
    "manager": {"distributed": {"_target_": f"{AM}.megatron_fsdp.MegatronFSDPManager"}},
    "config block": {"distributed_config": {"_target_": f"{AM}.config.MegatronFSDPConfig"}},
}


def at(warnings, loc):
    return [w for w in warnings if w.loc == loc]


def megatron(recipe, spelling="strategy", **options):
    for section, values in SPELLINGS[spelling].items():
        recipe[section] = {**recipe.get(section, {}), **values}
        if section == "distributed_config":
            recipe[section].update(options)
            recipe["distributed"].pop("strategy", None)
    if spelling != "config block":
        recipe["distributed"].update(options)
        if spelling == "manager":
            recipe["distributed"].pop("strategy", None)
    return recipe


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_each_spelling_runs_as_fsdp2_with_one_warning_at_the_strategy(
    validate, recipe, spelling, accelerator
):
    result = validate(megatron(recipe, spelling), nproc_per_node=2, accelerator=accelerator)
    assert result.valid, [str(e) for e in result.errors]
    (warning,) = at(result.warnings, "distributed.strategy")
    assert warning.msg == RUNS_AS_FSDP2 and "fsdp2" in warning.fix
    assert "FSDP2" in warning.msg and "fully_shard" in warning.msg
    assert "not Megatron-Core's FSDP" in warning.msg and "math is the same" in warning.msg
    assert [w.loc for w in result.warnings].count("distributed.strategy") == 1
    assert not at(result.warnings, "distributed")  # defaults ask for nothing unusual
    # the plan, the stored recipe and the trainer's typed topology agree: fsdp2
    assert result.plan["strategy"] == "fsdp2" == result.recipe["topology"]["strategy"]
    assert result.typed.topology.strategy == "fsdp2"
    assert result.plan["mesh_shape"] == result.setup.mesh_shape
    assert result.setup.mesh_shape["dp_shard"] == 2
    assert result.typed.topology.reshard_after_forward is True  # zero_dp_strategy 3
    assert any(w["loc"] == "distributed.strategy" for w in result.plan["warnings"])


@pytest.mark.parametrize(
    ("level", "reshard", "warned"), [(3, True, False), (2, False, False), (1, False, True), (0, False, True)]
)  # fmt: skip
def test_zero_dp_strategy_maps_onto_reshard_after_forward(validate, recipe, level, reshard, warned):
    result = validate(megatron(recipe, zero_dp_strategy=level), nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    options = result.recipe["topology"]["options"]
    assert options["reshard_after_forward"] is reshard and "zero_dp_strategy" not in options
    warnings = at(result.warnings, "distributed.zero_dp_strategy")
    assert bool(warnings) == warned
    if warned:
        (warning,) = warnings
        assert "shards more than asked" in warning.msg and "math" in warning.msg
        assert "zero_dp_strategy: 2 or 3" in warning.fix
        assert ("strategy: ddp" in warning.fix) == (level == 0)


def test_zero_dp_strategy_out_of_range_is_an_error(validate, recipe):
    error_at(validate(megatron(recipe, zero_dp_strategy=4)), "distributed.zero_dp_strategy")


def test_grad_reduce_in_fp32_is_fsdp2s_float32_reduce_in_the_params_dtype(validate, recipe):
    result = validate(megatron(recipe, grad_reduce_in_fp32=True), accelerator="cuda")
    assert result.valid, [str(e) for e in result.errors]
    policy = result.typed.topology.mixed_precision
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (
        None,
        "float32",
        None,
    )
    off = validate(megatron(recipe, grad_reduce_in_fp32=False), accelerator="cuda")
    assert off.typed.topology.mixed_precision is None  # reduced in the params' own dtype


def test_sequence_parallel_and_activation_checkpointing_carry_over(validate, recipe):
    megatron(recipe, "config block", sequence_parallel=True, activation_checkpointing=True)
    recipe["distributed"]["tp_size"] = 2
    result = validate(recipe, nproc_per_node=4)
    assert result.valid, [str(e) for e in result.errors]
    topology = result.typed.topology
    assert topology.sequence_parallel and topology.activation_checkpointing == "full"
    assert topology.mesh_shape == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}


def test_tuning_options_are_accepted_and_named_in_one_warning(validate, recipe):
    options = {
        "overlap_grad_reduce": False,
        "nccl_ub": True,
        "fsdp_double_buffer": True,
        "megatron_fsdp_unit_modules": ["transformers.models.llama.LlamaDecoderLayer"],
        "check_for_nan_in_grad": False,
        "report_nan_in_param_grad": True,
        "keep_fp8_transpose_cache": True,
        "preserve_fp32_weights": True,
        "init_fsdp_with_meta_device": True,
        "average_in_collective": True,
        "disable_bucketing": True,
        "calculate_per_token_loss": True,
        "overlap_param_gather": True,  # its default: not named
    }
    result = validate(megatron(recipe, "config block", **options))
    assert result.valid, [str(e) for e in result.errors]
    (warning,) = at(result.warnings, "distributed")
    for name in set(options) - {"overlap_param_gather"}:
        assert name in warning.msg, name
    assert "overlap_param_gather" not in warning.msg
    assert "without effect" in warning.msg
    assert not set(options) & set(result.recipe["topology"]["options"])


def test_one_tuning_option_is_warned_at_its_field(validate, recipe):
    result = validate(megatron(recipe, nccl_ub=True))
    (warning,) = at(result.warnings, "distributed.nccl_ub")
    assert "without effect" in warning.msg and "NCCL user buffers" in warning.msg


def test_an_fsdp2_only_option_is_still_not_one_of_megatron_fsdp(validate, recipe):
    error = error_at(validate(megatron(recipe, cpu_offload=True)), "distributed.cpu_offload")
    assert "megatron_fsdp" in error.msg


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("field", ["pp_size", "ep_size"])
def test_megatron_fsdp_rules_still_refuse_pp_and_ep(validate, recipe, spelling, field):
    megatron(recipe, spelling)
    recipe["distributed"][field] = 2
    error = error_at(validate(recipe, nproc_per_node=4), f"distributed.{field}")
    assert "megatron_fsdp" in error.msg


def test_megatron_fsdp_rules_still_refuse_replicas_and_selective_checkpointing(validate, recipe):
    result = validate(megatron(recipe, dp_replicate_size=2), nproc_per_node=4)
    assert "megatron_fsdp" in error_at(result, "distributed.dp_replicate_size").msg
    recipe["distributed"].pop("dp_replicate_size")
    recipe["distributed"]["activation_checkpointing"] = "selective"
    error_at(validate(recipe), "distributed.activation_checkpointing")


def test_as_fsdp2_keeps_the_sizes_and_leaves_other_setups_alone():
    setup = DistributedSetup.build(
        MegatronFSDPConfig(zero_dp_strategy=2),
        ParallelismSizes(tp_size=2, cp_size=2),
        activation_checkpointing=True,
        world_size=8,
    )
    folded, warnings = as_fsdp2(setup)
    assert isinstance(folded.strategy_config, FSDP2Config) and folded.strategy == "fsdp2"
    assert folded.strategy_config.reshard_after_forward is False
    assert (folded.sizes, folded.world_size, folded.activation_checkpointing) == (
        setup.sizes,
        8,
        "full",
    )
    assert folded.mesh_shape == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2}
    assert [w.loc for w in warnings] == ["distributed.strategy"]
    fsdp2 = DistributedSetup.build("fsdp2", world_size=2)
    assert as_fsdp2(fsdp2) == (fsdp2, []) and as_fsdp2(None) == (None, [])
