"""DistributedSetup and its topology rules (issue 2, section 5)."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at, locs

from jobs.recipe.topology.setup import (
    DDPConfig,
    DistributedSetup,
    DistributedSetupInvalid,
    FSDP2Config,
    MoEParallelConfig,
    ParallelismSizes,
    PipelineConfig,
)


@pytest.fixture
def hub_recipe(recipe):
    """The model is a hub name with no cached config: only the topology rules apply."""
    recipe["model"]["pretrained_model_name_or_path"] = "org/model"
    return recipe


def build_errors(**kwargs) -> list[str]:
    with pytest.raises(DistributedSetupInvalid) as info:
        DistributedSetup.build(**kwargs)
    return [e.loc for e in info.value.errors]


def test_build_resolves_dp_and_the_fsdp2_mesh():
    setup = DistributedSetup.build(
        strategy=FSDP2Config(sequence_parallel=True),
        parallelism_sizes=ParallelismSizes(tp_size=2, dp_replicate_size=2),
        activation_checkpointing=True,
        world_size=8,
    )
    assert setup.dp_size == 4 and setup.dp_shard_size == 2
    assert setup.mesh_shape == {"pp": 1, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    assert list(setup.mesh_shape) == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    assert setup.activation_checkpointing == "full"


def test_mesh_for_ddp_and_megatron_fsdp():
    assert DistributedSetup.build("ddp", world_size=4).mesh_shape == {"dp": 4}
    mfsdp = DistributedSetup.build("megatron-fsdp", ParallelismSizes(tp_size=2), world_size=4)
    assert mfsdp.strategy == "megatron_fsdp" and mfsdp.mesh_shape == {"dp": 2, "cp": 1, "tp": 2}


@pytest.mark.parametrize("alias", ["megatron_fsdp", "megatron-fsdp", "mfsdp", "MFSDP"])
def test_megatron_fsdp_aliases_resolve_and_run_as_fsdp2(validate, hub_recipe, alias):
    hub_recipe["distributed"]["strategy"] = alias
    for accelerator in ("cpu", "cuda"):
        result = validate(hub_recipe, accelerator=accelerator)
        assert result.plan["strategy"] == "fsdp2", [str(e) for e in result.errors]
        assert not [e for e in result.errors if e.loc == "distributed.strategy"]
        assert "runs as FSDP2" in next(
            w.msg for w in result.warnings if w.loc == "distributed.strategy"
        )


def test_build_is_a_value_error_and_frozen():
    with pytest.raises(ValueError):
        DistributedSetup.build("fsdp3", world_size=1)
    setup = DistributedSetup.build(world_size=2)
    with pytest.raises(AttributeError):
        setup.world_size = 3  # type: ignore[misc]


def test_build_accepts_dict_sub_configs_and_defaults_them():
    setup = DistributedSetup.build(
        parallelism_sizes=ParallelismSizes(pp_size=2, ep_size=2),
        pipeline_config={"pp_microbatch_size": 2},
        world_size=4,
    )
    assert setup.pipeline_config == PipelineConfig(pp_microbatch_size=2)
    assert setup.moe_parallel_config == MoEParallelConfig()  # ep > 1 gets a default
    assert (
        DistributedSetup.build(
            parallelism_sizes=ParallelismSizes(pp_size=2), world_size=2
        ).pipeline_config
        == PipelineConfig()
    )


def test_unknown_strategy(validate, hub_recipe):
    hub_recipe["distributed"]["strategy"] = "fsdp"
    assert "fsdp2" in error_at(validate(hub_recipe), "distributed.strategy").fix


@pytest.mark.parametrize(
    ("strategy", "option"),
    [("fsdp2", "zero_dp_strategy"), ("ddp", "sequence_parallel"), ("megatron_fsdp", "cpu_offload")],
)
def test_unknown_options_of_the_strategy(validate, hub_recipe, strategy, option):
    hub_recipe["distributed"].update(strategy=strategy, **{option: True})
    assert strategy in error_at(validate(hub_recipe), f"distributed.{option}").msg


def test_misspelt_size_suggests_the_field(validate, hub_recipe):
    hub_recipe["distributed"]["tp_sise"] = 2
    assert "tp_size" in error_at(validate(hub_recipe), "distributed.tp_sise").fix


@pytest.mark.parametrize(
    "field", ["tp_size", "cp_size", "pp_size", "ep_size", "dp_size", "dp_replicate_size"]
)
@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True])
def test_sizes_are_positive_integers(validate, hub_recipe, field, value):
    hub_recipe["distributed"][field] = value
    assert "positive integer" in error_at(validate(hub_recipe), f"distributed.{field}").msg


@pytest.mark.parametrize("value", ["auto", "none", None])
def test_dp_auto_is_inferred(validate, hub_recipe, value):
    hub_recipe["distributed"].update(dp_size=value, tp_size=2)
    assert validate(hub_recipe, nproc_per_node=4, nnodes=2).plan["dp_size"] == 4


def test_world_size_is_nnodes_times_nproc(validate, hub_recipe):
    plan = validate(hub_recipe, nproc_per_node=4, nnodes=2).plan
    assert plan["world_size"] == 8 and plan["dp_size"] == 8


def test_inferred_dp_must_be_exact(validate, hub_recipe):
    hub_recipe["distributed"]["tp_size"] = 3
    assert "divide" in error_at(validate(hub_recipe, nproc_per_node=4), "distributed.tp_size").msg


def test_explicit_dp_must_fill_the_world(validate, hub_recipe):
    hub_recipe["distributed"].update(dp_size=3, tp_size=1)
    error_at(validate(hub_recipe, nproc_per_node=4), "distributed.dp_size")


def test_pipeline_config_without_pp_is_a_warning(validate, hub_recipe):
    hub_recipe["distributed"]["pipeline"] = {"pp_schedule": "gpipe"}
    result = validate(hub_recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "pp_size is 1" in next(w for w in result.warnings if w.loc == "distributed.pipeline").msg


def test_pipeline_config_fields_are_checked(validate, hub_recipe):
    hub_recipe["distributed"].update(pp_size=2, pipeline={"pp_schedul": "gpipe"})
    assert (
        "pp_schedule"
        in error_at(validate(hub_recipe, nproc_per_node=2), "distributed.pipeline.pp_schedul").fix
    )


def test_moe_config_needs_ep(validate, hub_recipe):
    hub_recipe["distributed"]["moe"] = {"reshard_after_forward": True}
    assert "ep_size" in error_at(validate(hub_recipe), "distributed.moe").msg


def test_dp_replicate_only_with_fsdp2(validate, hub_recipe):
    hub_recipe["distributed"].update(strategy="ddp", dp_replicate_size=2)
    assert (
        "fsdp2"
        in error_at(validate(hub_recipe, nproc_per_node=4), "distributed.dp_replicate_size").msg
    )


@pytest.mark.parametrize(("world", "replicate"), [(4, 3), (2, 2), (4, 4)])
def test_dp_replicate_divides_dp_and_is_smaller(validate, hub_recipe, world, replicate):
    hub_recipe["distributed"]["dp_replicate_size"] = replicate
    error_at(validate(hub_recipe, nproc_per_node=world), "distributed.dp_replicate_size")


@pytest.mark.parametrize("field", ["tp_size", "pp_size", "cp_size", "ep_size"])
def test_ddp_is_data_parallel_only(validate, hub_recipe, field):
    hub_recipe["distributed"].update(strategy="ddp", **{field: 2})
    assert "ddp" in error_at(validate(hub_recipe, nproc_per_node=4), f"distributed.{field}").msg


@pytest.mark.parametrize("field", ["pp_size", "ep_size"])
def test_megatron_fsdp_has_no_pp_or_ep(validate, hub_recipe, field):
    hub_recipe["distributed"].update(strategy="megatron_fsdp", **{field: 2})
    error_at(validate(hub_recipe, nproc_per_node=4), f"distributed.{field}")


def test_fsdp2_ep_must_divide_dp_cp_tp():
    assert build_errors(parallelism_sizes=ParallelismSizes(ep_size=4), world_size=6) == [
        "distributed.ep_size"
    ]
    DistributedSetup.build(parallelism_sizes=ParallelismSizes(ep_size=3), world_size=6)


def test_sequence_parallel_needs_tp(validate, recipe):
    recipe["distributed"]["sequence_parallel"] = True
    error_at(validate(recipe), "distributed.sequence_parallel")
    recipe["distributed"]["tp_size"] = 2
    assert validate(recipe, nproc_per_node=2).valid


def test_model_parallel_sizes_need_a_readable_config(validate, hub_recipe):
    """An uncached hub model's architecture is unknown: its tp support cannot be checked."""
    hub_recipe["distributed"]["tp_size"] = 2
    error = error_at(validate(hub_recipe, nproc_per_node=2), "distributed.tp_size")
    assert "config.json is not readable" in error.msg and "cache" in error.fix


@pytest.mark.parametrize("mode", [False, True, "full", "selective"])
def test_activation_checkpointing_modes(validate, hub_recipe, mode):
    hub_recipe["distributed"]["activation_checkpointing"] = mode
    assert validate(hub_recipe).valid


@pytest.mark.parametrize("mode", ["partial", 1, "yes"])
def test_activation_checkpointing_bad_mode(validate, hub_recipe, mode):
    hub_recipe["distributed"]["activation_checkpointing"] = mode
    error_at(validate(hub_recipe), "distributed.activation_checkpointing")


def test_selective_checkpointing_only_with_fsdp2_or_ddp(validate, hub_recipe):
    hub_recipe["distributed"].update(strategy="megatron_fsdp", activation_checkpointing="selective")
    error_at(validate(hub_recipe), "distributed.activation_checkpointing")
    hub_recipe["distributed"]["strategy"] = "ddp"
    assert validate(hub_recipe).valid


@pytest.mark.parametrize("scope", ["language", ["vision", "audio"], "multimodal", "all"])
def test_checkpointing_scopes(validate, hub_recipe, scope):
    hub_recipe["distributed"]["activation_checkpointing_scope"] = scope
    assert validate(hub_recipe).valid


@pytest.mark.parametrize("scope", ["text", ["all", "vision"], 3])
def test_bad_checkpointing_scopes(validate, hub_recipe, scope):
    hub_recipe["distributed"]["activation_checkpointing_scope"] = scope
    error_at(validate(hub_recipe), "distributed.activation_checkpointing_scope")


@pytest.mark.parametrize(
    ("key", "points_to"),
    [
        ("distributed_config", "distributed"),
        ("moe_mesh", "distributed.ep_size"),
        ("pipeline_config", "distributed.pipeline"),
        ("moe_config", "distributed.moe"),
        ("activation_checkpointing", "distributed.activation_checkpointing"),
        ("tp_plan", "distributed.tp_size"),
    ],
)
def test_legacy_flat_loader_kwargs_point_to_distributed(validate, hub_recipe, key, points_to):
    hub_recipe["model"][key] = {"a": 1} if key != "activation_checkpointing" else True
    result = validate(hub_recipe)
    assert points_to in error_at(result, f"model.{key}").fix
    assert locs(result).count(f"model.{key}") == 1


def test_distributed_setup_and_device_mesh_together(validate, hub_recipe):
    hub_recipe["model"].update(distributed_setup={}, device_mesh={})
    assert "exclusive" in error_at(validate(hub_recipe), "model.device_mesh").msg


def test_normalized_distributed_section(validate, recipe):
    recipe["distributed"].update(tp_size=2, sequence_parallel=True)
    dist = validate(recipe, nproc_per_node=4).recipe["topology"]
    assert dist["strategy"] == "fsdp2" and dist["dp_size"] == 2 and dist["sequence_parallel"]


def test_ddp_config_object_is_accepted():
    setup = DistributedSetup.build(DDPConfig(find_unused_parameters=True), world_size=2)
    assert setup.strategy == "ddp" and setup.to_dict()["find_unused_parameters"] is True


@pytest.mark.parametrize(
    ("target", "strategy"),
    [
        ("nemo_automodel.components.distributed.fsdp2.FSDP2Manager", "fsdp2"),
        ("nemo_automodel.components.distributed.ddp.DDPManager", "ddp"),
    ],
)
def test_automodel_manager_target_names_the_strategy(validate, hub_recipe, target, strategy):
    hub_recipe["distributed"] = {"_target_": target, "dp_size": "none"}
    assert validate(hub_recipe).recipe["topology"]["strategy"] == strategy


def test_other_distributed_target_is_refused(validate, hub_recipe):
    hub_recipe["distributed"]["_target_"] = "os.system"
    error_at(validate(hub_recipe), "distributed._target_")


def test_distributed_section_must_be_a_mapping(validate, hub_recipe):
    hub_recipe["distributed"] = "fsdp2"
    error_at(validate(hub_recipe), "distributed")


def test_legacy_kwarg_with_a_null_value_is_still_an_error(validate, hub_recipe):
    hub_recipe["model"]["tp_plan"] = None
    error_at(validate(hub_recipe), "model.tp_plan")


def test_single_device_mesh_in_model_is_an_error(validate, hub_recipe):
    hub_recipe["model"]["device_mesh"] = None
    assert "distributed" in error_at(validate(hub_recipe), "model.device_mesh").fix


def test_sub_config_aliases(validate, hub_recipe):
    hub_recipe["distributed"]["moe_parallel_config"] = {}
    error_at(validate(hub_recipe), "distributed.moe")  # needs ep > 1
    hub_recipe["distributed"].update(pp_size=2, pipeline_config={"pp_schedul": "gpipe"})
    error_at(validate(hub_recipe, nproc_per_node=2), "distributed.pipeline.pp_schedul")
