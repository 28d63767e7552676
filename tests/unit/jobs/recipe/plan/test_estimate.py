"""`plan.estimate`: memory per rank divided by the topology, FLOPs and time; the refusal of a
recipe that cannot fit its device, with the ranked fixes, each re-estimated."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from recipe_asserts import error_at, write_model_dir

from jobs.recipe.load import limits as lim
from jobs.recipe.plan import estimate as est
from jobs.recipe.plan.flops import model_flops_per_token, param_count
from jobs.recipe.plan.memory_fit import parse_memory_size
from jobs.recipe.validation import validate_job

GIB = 2**30
# ~6M parameters, vocab 8k, float32: with micro-batch 4 x 1024 tokens it needs ~1.3 GiB on
# CPU, which activation checkpointing alone brings under a 1 GiB device's usable 0.9 GiB
MEDIUM = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8192,
          "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 8,
          "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": False}  # fmt: skip


@pytest.fixture
def medium(recipe: dict[str, Any], data_root) -> dict[str, Any]:
    out = copy.deepcopy(recipe)
    out["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "medium", MEDIUM)
    )
    out["dataset"]["max_seq_length"] = 1024
    out["dataloader"] = {"batch_size": 4}
    out["step_scheduler"] = {"max_steps": 100, "global_batch_size": 16}
    return out


def _size(value: int) -> str:
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.0f} MiB"


def _estimate(validate, recipe, **resources) -> dict[str, Any]:
    result = validate(recipe, **resources)
    assert result.valid, [str(e) for e in result.errors]
    return result.plan["estimate"]


def test_estimate_has_every_part_and_they_add_up(validate, medium):
    estimate = _estimate(validate, medium)
    memory = estimate["memory_per_rank_bytes"]
    assert set(memory) == {"params", "grads", "optimizer", "activations", "workspace", "total"}
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")
    params = param_count(MEDIUM)
    assert memory["params"] == params * 4  # float32, one rank
    assert memory["grads"] == params * 4
    assert memory["optimizer"] == params * 4 * est.OPTIMIZER_STATES["AdamW"]
    phases = estimate["basis"]["phases_bytes"]
    assert estimate["basis"]["peak_phase"] == max(phases, key=phases.get)
    assert memory["total"] >= max(phases.values())  # the peak phase, and the process's own
    for key in ("flops_per_step", "step_seconds", "eta_seconds", "device_hours", "basis"):
        assert estimate[key] is not None


def test_flops_and_time_follow_tokens_steps_and_the_default_throughput(validate, medium):
    estimate = _estimate(validate, medium)
    per_token = model_flops_per_token(MEDIUM, 1024)
    assert estimate["flops_per_step"] == per_token * 16 * 1024
    rate = est.DEFAULT_FLOPS_PER_RANK["cpu"]
    assert estimate["step_seconds"] == pytest.approx(per_token * 16 * 1024 / rate)
    assert estimate["eta_seconds"] == pytest.approx(estimate["step_seconds"] * 100)
    assert estimate["device_hours"] == pytest.approx(estimate["eta_seconds"] / 3600)
    assert estimate["basis"]["throughput"] == "default"


def test_a_learned_throughput_replaces_the_default(settings, medium):
    result = validate_job(medium, (), None, settings, flops_per_rank=1e12)
    estimate = result.plan["estimate"]
    assert estimate["basis"]["throughput_flops_per_rank"] == 1e12
    assert estimate["basis"]["throughput"] == "learned from this queue's finished jobs"
    assert estimate["step_seconds"] == pytest.approx(estimate["flops_per_step"] / 1e12)


def test_fsdp_shards_params_grads_and_optimizer_over_dp_shard(validate, medium):
    one = _estimate(validate, medium)["memory_per_rank_bytes"]
    two = _estimate(validate, medium, nproc_per_node=2)["memory_per_rank_bytes"]
    for part in ("params", "grads", "optimizer"):
        assert two[part] == pytest.approx(one[part] / 2, rel=1e-6)
    assert two["activations"] == one["activations"]  # same micro-batch per rank
    assert two["workspace"] > one["workspace"]  # FSDP2 gathers a unit at a time


def test_lora_leaves_the_frozen_base_without_grads_or_optimizer_state(validate, medium):
    medium["peft"] = {"dim": 8, "target_modules": ["q_proj", "v_proj"]}
    estimate = _estimate(validate, medium)
    adapters = 8 * 8 * ((256 + 256) + (256 + 128))  # 8 layers, q 256->256, v 256->128
    assert estimate["trainable_params"] == adapters
    memory = estimate["memory_per_rank_bytes"]
    assert memory["grads"] == adapters * 4
    assert memory["params"] == param_count(MEDIUM) * 4


def test_activation_checkpointing_and_bf16_and_sgd_shrink_their_parts(validate, medium):
    base = _estimate(validate, medium)["memory_per_rank_bytes"]
    ac = copy.deepcopy(medium)
    ac["distributed"]["activation_checkpointing"] = True
    assert _estimate(validate, ac)["memory_per_rank_bytes"]["activations"] < base["activations"]
    bf16 = copy.deepcopy(medium)
    bf16["model"]["dtype"] = "bfloat16"
    assert _estimate(validate, bf16)["memory_per_rank_bytes"]["params"] * 2 == base["params"]
    sgd = copy.deepcopy(medium)
    sgd["optimizer"] = {"_target_": "torch.optim.SGD", "lr": 0.1}
    assert _estimate(validate, sgd)["memory_per_rank_bytes"]["optimizer"] == 0


def test_a_recipe_that_cannot_fit_one_gib_is_refused_with_ranked_fixes(settings, medium):
    result = validate_job(medium, (), None, settings, device_memory=GIB)
    assert not result.valid
    error = error_at(result, "distributed")
    total = result.plan["estimate"]["memory_per_rank_bytes"]["total"]
    assert f"{total / GIB:.2f} GiB per rank" in error.msg
    assert "the device has 1.00 GiB, 922 MiB usable after the 10% margin" in error.msg
    fixes = result.plan["estimate"]["fit"]["fixes"]
    assert [f["fits"] for f in fixes] == sorted((f["fits"] for f in fixes), reverse=True)
    assert fixes[0]["fits"]
    assert fixes[0]["change"].startswith("distributed.activation_checkpointing")
    assert all(f["total_bytes"] < total for f in fixes)
    for i, fix in enumerate(fixes, 1):  # each fix in the message, with its new estimate
        assert f"{i}) {fix['change']} -> {_size(fix['total_bytes'])}" in error.fix


def test_a_fix_really_fits_when_applied(settings, medium):
    refused = validate_job(medium, (), None, settings, device_memory=GIB)
    first = refused.plan["estimate"]["fit"]["fixes"][0]
    fixed = copy.deepcopy(medium)
    fixed["distributed"]["activation_checkpointing"] = True
    accepted = validate_job(fixed, (), None, settings, device_memory=GIB)
    assert accepted.valid, [str(e) for e in accepted.errors]
    estimate = accepted.plan["estimate"]
    assert estimate["memory_per_rank_bytes"]["total"] == first["total_bytes"]
    assert estimate["fit"]["fits"] is True


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_recipe_at_1_2x_the_device_is_refused_and_at_0_8x_accepted(settings, medium, nproc):
    """The refusal reads the whole-run estimate: 1.2x the declared memory is refused with
    fixes that each fit or say they do not; 0.8x (inside the 10% margin) is accepted."""
    resources = {"nproc_per_node": nproc}
    total = validate_job(medium, (), resources, settings).plan["estimate"]
    total = total["memory_per_rank_bytes"]["total"]
    refused = validate_job(medium, (), resources, settings, device_memory=int(total / 1.2))
    assert not refused.valid
    error = error_at(refused, "distributed")
    assert f"{total / GIB:.2f} GiB per rank" in error.msg
    fixes = refused.plan["estimate"]["fit"]["fixes"]
    assert fixes and fixes[0]["fits"] and error.fix.startswith("cheapest first: 1) ")
    accepted = validate_job(medium, (), resources, settings, device_memory=int(total / 0.8))
    assert accepted.valid, [str(e) for e in accepted.errors]
    fit = accepted.plan["estimate"]["fit"]
    assert fit["fits"] is True and fit["fixes"] == []


def test_nothing_fits_then_all_fixes_together_are_offered(settings, medium):
    result = validate_job(medium, (), None, settings, device_memory=64 << 20)
    fixes = result.plan["estimate"]["fit"]["fixes"]
    assert not any(f["fits"] for f in fixes)
    assert fixes[-1]["change"].startswith("all of:")
    assert fixes[-1]["total_bytes"] == min(f["total_bytes"] for f in fixes)


def test_unknown_model_sizes_give_no_estimate_and_a_warning(settings, recipe, data_root):
    broken = copy.deepcopy(recipe)
    config = {**MEDIUM, "hidden_size": "wide", "num_hidden_layers": 10**12}
    broken["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "broken", config)
    )
    result = validate_job(broken, (), None, settings, device_memory=GIB)
    assert result.plan["estimate"] is None and result.plan["param_count"] is None
    assert any(w.loc == "distributed" and "not checked" in w.msg for w in result.warnings)


@pytest.mark.parametrize(
    "bad",
    [{"head_dim": "wide"}, {"qk_nope_head_dim": "x", "qk_rope_head_dim": 8},
     {"num_attention_heads": 0}, {"vocab_size": 2.5}, {"mlp_only_layers": 5,
     "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4}],
)  # fmt: skip
def test_config_fields_of_the_wrong_kind_give_no_estimate(settings, recipe, data_root, bad):
    broken = copy.deepcopy(recipe)
    path = write_model_dir(data_root / "odd", {**MEDIUM, **bad})
    broken["model"]["pretrained_model_name_or_path"] = str(path)
    result = validate_job(broken, (), None, settings, device_memory=GIB)  # never raises
    assert result.plan["estimate"] is None


@pytest.mark.parametrize(
    ("text", "value"),
    [("80GiB", 80 * GIB), ("80GB", 80 * GIB), ("512MiB", 512 << 20), ("1.5g", int(1.5 * GIB)),
     ("1073741824", GIB), ("", None), ("-1GiB", None), ("lots", None), ("0", None)],
)  # fmt: skip
def test_parse_memory_size(text, value):
    assert parse_memory_size(text) == value


# Within every size maximum of load.limits, but 4096 layers: the activations of a micro-batch
# of 2**24 tokens come to about 2**55 bytes, past what the plan stores exactly.
DEEP = {**MEDIUM, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8}  # fmt: skip


@pytest.mark.parametrize(
    "past",
    [{"hidden_size": lim.MAX_MODEL_SIZES["hidden_size"] + 1},
     {"num_hidden_layers": lim.MAX_MODEL_SIZES["num_hidden_layers"] + 1},
     {"vocab_size": lim.MAX_VOCAB_SIZE + 1},
     {"intermediate_size": lim.MAX_MODEL_SIZES["intermediate_size"] + 1},
     # each size within its maximum, together past MAX_PARAM_COUNT
     {"hidden_size": 2**17, "intermediate_size": 2**20, "num_hidden_layers": 2**12}],
)  # fmt: skip
def test_a_model_config_past_its_maxima_gets_no_estimate(settings, medium, data_root, past):
    """As for a config without sizes: nothing the plan would store is computed from it."""
    path = write_model_dir(data_root / "past", {**MEDIUM, **past})
    medium["model"]["pretrained_model_name_or_path"] = str(path)
    result = validate_job(medium, (), None, settings)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["param_count"] is None and result.plan["estimate"] is None
    with pytest.raises(ValueError):
        param_count({**MEDIUM, **past})


def test_a_model_config_override_past_its_maxima_gets_no_estimate(settings, medium):
    """`from_config` with a config override: the sizes the trainer would build."""
    medium["model"]["_target_"] = "tuneyard.models.AutoModelForCausalLM.from_config"
    medium["model"]["config"] = medium["model"].pop("pretrained_model_name_or_path")
    medium["model"]["hidden_size"] = lim.MAX_MODEL_SIZES["hidden_size"] + 256
    result = validate_job(medium, (), None, settings)
    assert result.plan["estimate"] is None and result.plan["param_count"] is None


def test_an_estimate_past_exact_integers_is_not_stored(settings, medium, data_root):
    """Each number within its maximum, their product is not: no estimate rather than one
    whose integers JSON clients (and int64 columns, further on) cannot hold."""
    path = write_model_dir(data_root / "deep", DEEP)
    medium["model"]["pretrained_model_name_or_path"] = str(path)
    medium["dataloader"]["batch_size"] = 2**8
    medium["dataset"]["max_seq_length"] = 2**16
    medium["step_scheduler"]["global_batch_size"] = 2**8
    result = validate_job(medium, (), None, settings)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["param_count"] == param_count(DEEP) <= lim.MAX_PARAM_COUNT
    assert result.plan["estimate"] is None
    medium["dataloader"]["batch_size"] = 2  # 2**17 tokens per micro-batch: an estimate
    medium["step_scheduler"]["global_batch_size"] = 2
    assert est.in_range(validate_job(medium, (), None, settings).plan["estimate"])


@pytest.mark.parametrize(
    ("value", "ok"),
    [(2**53, True), (-(2**53), True), (2**53 + 1, False), (2**63, False), (1e300, True),
     (math.inf, False), (-math.inf, False), (math.nan, False), (True, True), ("x", True),
     ({"a": [1, {"b": 2**60}]}, False), ({"a": [1.5, {"b": None}]}, True)],
)  # fmt: skip
def test_in_range_means_exact_integers_and_finite_floats(value, ok):
    assert est.in_range(value) is ok


def test_an_infinite_learned_throughput_is_not_used(settings, medium):
    """Not a rate a queue measured: the default stands, and no step takes zero seconds."""
    result = validate_job(medium, (), None, settings, flops_per_rank=math.inf)
    estimate = result.plan["estimate"]
    assert estimate["basis"]["throughput"] == "default"
    assert est.in_range(estimate) and estimate["step_seconds"] > 0
