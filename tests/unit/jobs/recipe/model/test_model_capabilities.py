"""Model capabilities from the torch-free registry, config reading, the plan (sections 8, 9)."""

from __future__ import annotations

import json
import os

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, TINY_LLAMA_PARAMS, error_at, locs, write_model_dir

from jobs.recipe.model.config import estimate_param_count

MOE_CONFIG = {
    **TINY_LLAMA_CONFIG,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
}
UNKNOWN_CONFIG = {**TINY_LLAMA_CONFIG, "architectures": ["FancyForCausalLM"], "model_type": "fancy"}


def test_llama_supports_tensor_parallelism(validate, recipe):
    recipe["distributed"].update(tp_size=2, sequence_parallel=True)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid and result.plan["architecture"] == "LlamaForCausalLM"


def test_expert_parallelism_is_refused_for_dense_llama(validate, recipe):
    recipe["distributed"]["ep_size"] = 2
    error_at(validate(recipe, nproc_per_node=2), "distributed.ep_size")


def test_each_unsupported_size_is_its_own_error(validate, recipe, data_root):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "fancy", UNKNOWN_CONFIG)
    )
    recipe["distributed"].update(tp_size=2, cp_size=2)
    result = validate(recipe, nproc_per_node=4)
    for field in ("distributed.tp_size", "distributed.cp_size"):
        capability = [e for e in result.errors if e.loc == field and "FancyForCausalLM" in e.msg]
        assert len(capability) == 1, [str(e) for e in result.errors]


def test_unknown_architecture_falls_back_to_data_parallel(validate, recipe, data_root):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "fancy", UNKNOWN_CONFIG)
    )
    result = validate(recipe, nproc_per_node=2)
    assert result.valid and result.plan["architecture"] == "FancyForCausalLM"
    recipe["distributed"]["sequence_parallel"] = True
    recipe["distributed"]["tp_size"] = 2
    result = validate(recipe, nproc_per_node=4)
    assert {"distributed.tp_size", "distributed.sequence_parallel"} <= set(locs(result))


def test_moe_row_without_tp(validate, recipe, data_root):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "moe", MOE_CONFIG)
    )
    recipe["distributed"]["tp_size"] = 2
    assert (
        "Qwen3MoeForCausalLM"
        in error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size").msg
    )


def test_inline_config_for_from_config(validate, recipe):
    recipe["model"] = {
        "_target_": "tuneyard.models.AutoModelForCausalLM.from_config",
        "config": dict(UNKNOWN_CONFIG),
    }
    recipe["distributed"]["tp_size"] = 2
    result = validate(recipe, nproc_per_node=2)
    error_at(result, "distributed.tp_size")
    assert result.plan["param_count"] == TINY_LLAMA_PARAMS


def test_inline_config_architecture_from_model_type(validate, recipe):
    config = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "architectures"}
    recipe["model"] = {
        "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config",
        "config": config,
    }
    assert validate(recipe).plan["architecture"] == "LlamaForCausalLM"


def test_model_dir_without_config_json(validate, recipe, data_root):
    (data_root / "empty_model").mkdir()
    recipe["model"]["pretrained_model_name_or_path"] = str(data_root / "empty_model")
    assert "config.json" in error_at(validate(recipe), "model.pretrained_model_name_or_path").msg


def test_unreadable_config_json(validate, recipe, model_dir):
    (model_dir / "config.json").write_text("{not json")
    error_at(validate(recipe), "model.pretrained_model_name_or_path")


def test_hub_model_config_is_read_from_the_cache(validate, recipe, empty_hf_cache):
    snapshot = empty_hf_cache / "models--org--fancy" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(UNKNOWN_CONFIG))
    (empty_hf_cache / "models--org--fancy" / "refs").mkdir()
    (empty_hf_cache / "models--org--fancy" / "refs" / "main").write_text("abc123")
    recipe["model"]["pretrained_model_name_or_path"] = "org/fancy"
    recipe["distributed"]["tp_size"] = 2
    result = validate(recipe, nproc_per_node=2)
    assert result.plan["architecture"] == "FancyForCausalLM"
    error_at(result, "distributed.tp_size")


def test_uncached_hub_model_has_no_architecture(validate, recipe):
    recipe["model"]["pretrained_model_name_or_path"] = "org/absent"
    plan = validate(recipe).plan
    assert plan["architecture"] is None and plan["param_count"] is None


def test_parameter_count_matches_transformers_numbers():
    # Numbers from transformers' LlamaForCausalLM on these configs (counted once by hand).
    assert estimate_param_count(TINY_LLAMA_CONFIG) == TINY_LLAMA_PARAMS
    assert estimate_param_count({**TINY_LLAMA_CONFIG, "tie_word_embeddings": True}) == 106_816
    biased = {**TINY_LLAMA_CONFIG, "attention_bias": True, "mlp_bias": True}
    assert estimate_param_count(biased) == 140_608
    assert estimate_param_count({**TINY_LLAMA_CONFIG, "head_dim": 32}) == 164_160
    assert estimate_param_count({"vocab_size": 10}) is None


def test_plan_has_every_key(validate, recipe):
    recipe["distributed"]["tp_size"] = 2
    recipe["step_scheduler"]["global_batch_size"] = 16
    plan = validate(recipe, nproc_per_node=4).plan
    estimate = plan.pop("estimate")  # its numbers: tests/unit/jobs/recipe/test_estimate.py
    assert set(estimate) >= {"memory_per_rank_bytes", "flops_per_step", "eta_seconds", "basis"}
    assert plan == {
        "trust_remote_code": False,
        "warnings": [],
        "world_size": 4,
        "nnodes": 1,
        "nproc_per_node": 4,
        "accelerator": "cpu",
        "strategy": "fsdp2",
        "mesh_shape": {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2},
        "dp_size": 2,
        "dp_replicate_size": 1,
        "dp_shard_size": 2,
        "tp_size": 2,
        "pp_size": 1,
        "cp_size": 1,
        "ep_size": 1,
        "grad_accumulation_steps": 2,
        "global_batch_size": 16,
        "local_batch_size": 4,
        "max_steps": 20,
        "seq_length": 64,
        "tokens_per_step": 16 * 64,
        "architecture": "LlamaForCausalLM",
        "param_count": TINY_LLAMA_PARAMS,
        "hub_revisions": {},
        "requires": {},
    }


def test_plan_of_an_invalid_topology_has_nulls(validate, recipe):
    recipe["distributed"]["tp_size"] = 3
    plan = validate(recipe, nproc_per_node=4).plan
    assert plan["world_size"] == 4 and plan["mesh_shape"] is None and plan["dp_size"] is None


def test_qwen3_moe_expert_parallelism_over_the_dp_ranks_is_valid(validate, recipe, data_root):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "moe", MOE_CONFIG)
    )
    recipe["distributed"]["ep_size"] = 2
    assert validate(recipe, nproc_per_node=2).valid


def test_qwen3_moe_expert_parallelism_over_part_of_the_dp_ranks_is_valid(
    validate, recipe, data_root
):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "moe", MOE_CONFIG)
    )
    recipe["distributed"]["ep_size"] = 2
    recipe["step_scheduler"]["global_batch_size"] = 16  # 4 ranks x batch_size 4
    result = validate(recipe, nproc_per_node=4)  # experts of ranks r and r + 2 alike
    assert result.valid, [str(e) for e in result.errors]


@pytest.mark.parametrize(
    ("world", "sizes", "fix"),
    [
        (4, {"ep_size": 2, "tp_size": 2}, "set distributed.ep_size: 1"),
        (4, {"ep_size": 2, "dp_replicate_size": 2}, "set distributed.ep_size: 1"),
    ],
)
def test_qwen3_moe_expert_parallelism_must_divide_the_dp_ranks(
    validate, recipe, data_root, world, sizes, fix
):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "moe", MOE_CONFIG)
    )
    recipe["distributed"].update(sizes)
    result = validate(recipe, nproc_per_node=world)
    err = error_at(result, "distributed.ep_size")
    assert "must divide dp_size" in err.msg and err.fix == fix


def test_qwen3_moe_expert_parallelism_takes_lora(validate, recipe, data_root):
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "moe", MOE_CONFIG)
    )
    recipe["distributed"]["ep_size"] = 2
    for peft in ({"match_all_linear": True}, {"target_modules": ["*"]}):
        recipe["peft"] = {**peft, "dim": 8, "alpha": 16}
        result = validate(recipe, nproc_per_node=2)
        assert result.valid, [str(e) for e in result.errors]


def test_star_on_experts_a_family_does_not_adapt_is_refused(validate, recipe, data_root):
    """`target_modules: ['*']` reaches the routed experts; a family without expert LoRA
    (here Qwen2-MoE, which runs through transformers) is refused at the field, naming the
    families that have it. `*_proj`, or a model without experts, is not."""
    qwen2_moe = {**MOE_CONFIG, "architectures": ["Qwen2MoeForCausalLM"],
                 "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "qwen2-moe", qwen2_moe)
    )
    recipe["peft"] = {"target_modules": ["*"], "dim": 8, "alpha": 16}
    err = error_at(validate(recipe), "peft.target_modules")
    assert "Qwen3MoeForCausalLM" in err.msg and "not Qwen2MoeForCausalLM" in err.msg
    recipe["peft"]["target_modules"] = ["*_proj"]
    assert validate(recipe).valid
    recipe["model"]["pretrained_model_name_or_path"] = str(data_root / "dense")
    write_model_dir(data_root / "dense", TINY_LLAMA_CONFIG)
    recipe["peft"]["target_modules"] = ["*"]
    assert validate(recipe).valid


# --- config.json is read with the root and symlink checks, and capped (issue 11, item 6) ---

STOLEN_CONFIG = {**TINY_LLAMA_CONFIG, "architectures": ["StolenForCausalLM"]}


def _stolen_config(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "config.json").write_text(json.dumps(STOLEN_CONFIG))
    return outside / "config.json"


def test_config_json_symlinked_out_of_the_roots_is_not_read(validate, recipe, data_root, tmp_path):
    model = data_root / "linked_model"
    model.mkdir()
    (model / "config.json").symlink_to(_stolen_config(tmp_path))
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    result = validate(recipe)
    assert (
        "outside the allowed roots" in error_at(result, "model.pretrained_model_name_or_path").msg
    )
    assert result.plan["architecture"] is None
    assert "Stolen" not in json.dumps(result.to_dict())


def test_config_json_symlinked_inside_the_roots_is_read(validate, recipe, data_root, model_dir):
    model = data_root / "alias_model"
    model.mkdir()
    (model / "config.json").symlink_to(model_dir / "config.json")
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    assert validate(recipe).plan["architecture"] == "LlamaForCausalLM"


def test_config_json_over_the_cap_is_refused_without_reading_it(validate, recipe, model_dir):
    from jobs.recipe.model.config import CONFIG_FILE_CAP

    with (model_dir / "config.json").open("r+b") as handle:
        handle.truncate(200 * 1024 * 1024)  # sparse: 200 MB that take no disk
    error = error_at(validate(recipe), "model.pretrained_model_name_or_path")
    assert str(CONFIG_FILE_CAP) in error.msg or "MiB" in error.msg


def test_config_json_just_over_the_cap(validate, recipe, model_dir):
    from jobs.recipe.model.config import CONFIG_FILE_CAP

    text = json.dumps(TINY_LLAMA_CONFIG)
    (model_dir / "config.json").write_text(
        text[:-1] + " " * (CONFIG_FILE_CAP - len(text) + 1) + "}"
    )
    error_at(validate(recipe), "model.pretrained_model_name_or_path")
    (model_dir / "config.json").write_text(text[:-1] + " " * (CONFIG_FILE_CAP - len(text)) + "}")
    assert validate(recipe).valid


def test_read_stops_after_cap_plus_one_bytes(monkeypatch):
    """A file whose size says 0 (as /proc's do) is still read no further than cap + 1."""
    from pathlib import Path

    from jobs.recipe.paths import roots as paths

    status = Path("/proc/self/status")
    assert status.stat().st_size == 0 and len(status.read_bytes()) > 100
    reads = []
    real_read = os.read
    monkeypatch.setattr(paths.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    data, errors = paths.read_bounded(status, "loc", [Path("/proc")], cap=10)
    assert data is None and "over the 10 bytes" in errors[0].msg and sum(reads) <= 11


def test_a_fifo_config_json_does_not_hang(validate, recipe, data_root):
    model = data_root / "fifo_model"
    model.mkdir()
    os.mkfifo(model / "config.json")
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    assert "regular file" in error_at(validate(recipe), "model.pretrained_model_name_or_path").msg


def test_inline_config_file_path_is_checked_too(validate, recipe, data_root, tmp_path):
    (data_root / "cfg.json").symlink_to(_stolen_config(tmp_path))
    recipe["model"] = {
        "_target_": "tuneyard.models.AutoModelForCausalLM.from_config",
        "config": str(data_root / "cfg.json"),
    }
    error_at(validate(recipe), "model.config")


def _hub_snapshot(cache, name="org--fancy", revision="abc123"):
    repo = cache / f"models--{name}"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return repo


def test_hub_cache_snapshot_symlinks_into_blobs_are_read(validate, recipe, empty_hf_cache):
    repo = _hub_snapshot(empty_hf_cache)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "0123abcd").write_text(json.dumps(UNKNOWN_CONFIG))
    (repo / "snapshots" / "abc123" / "config.json").symlink_to("../../blobs/0123abcd")
    recipe["model"]["pretrained_model_name_or_path"] = "org/fancy"
    assert validate(recipe).plan["architecture"] == "FancyForCausalLM"


def test_hub_cache_symlink_out_of_the_cache_is_not_read(validate, recipe, empty_hf_cache, tmp_path):
    repo = _hub_snapshot(empty_hf_cache)
    (repo / "snapshots" / "abc123" / "config.json").symlink_to(_stolen_config(tmp_path))
    recipe["model"]["pretrained_model_name_or_path"] = "org/fancy"
    result = validate(recipe)
    error_at(result, "model.pretrained_model_name_or_path")
    assert result.plan["architecture"] is None


def test_hub_cache_ref_cannot_walk_out_of_the_cache(validate, recipe, empty_hf_cache, tmp_path):
    _stolen_config(tmp_path)
    repo = _hub_snapshot(empty_hf_cache)
    depth = len(repo.relative_to(tmp_path).parts) + 1
    (repo / "refs" / "main").write_text("/".join([".."] * depth) + "/outside")
    recipe["model"]["pretrained_model_name_or_path"] = "org/fancy"
    result = validate(recipe)
    assert result.plan["architecture"] != "StolenForCausalLM"
