"""`load.limits`: every number that feeds the plan has a realistic maximum. The maximum is
accepted; one past it is refused at its own field, with a message or fix that names it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from recipe_asserts import error_at

from jobs.recipe.load import limits as lim
from jobs.recipe.sections.values import check_dataset_values
from jobs.recipe.topology.rules import SIZE_FIELDS, ParallelismSizes, size_errors

Edit = Callable[[dict[str, Any], Any], None]


def put(path: str, **also: Any) -> Edit:
    """Set `path` (dotted) to the value, and other dotted paths to fixed values (None
    removes a key): what the value needs besides itself to be valid."""

    def edit(recipe: dict[str, Any], value: Any) -> None:
        for where, what in [*also.items(), (path, value)]:
            *parents, key = where.replace("__", ".").split(".")
            holder = recipe
            for part in parents:
                holder = holder.setdefault(part, {})
            if what is None:
                holder.pop(key, None)
            else:
                holder[key] = what

    return edit


def bench(path: str, **also: Any) -> Edit:
    """A benchmark recipe (MockDataset, no scheduler) with `path` set."""

    def edit(recipe: dict[str, Any], value: Any) -> None:
        recipe["recipe"] = "llm_benchmark"
        recipe["dataset"] = {"_target_": "tuneyard.datasets.MockDataset", "vocab_size": 128,
                             "seq_length": 16}  # fmt: skip
        recipe.pop("lr_scheduler")
        recipe["step_scheduler"] = {"global_batch_size": 8}
        put(path, **also)(recipe, value)

    return edit


NO_GLOBAL = {"step_scheduler.global_batch_size": None}
# (loc of the error, maximum, how to set it, whether the recipe is valid at the maximum)
BOUNDED: list[tuple[str, int | float, Edit, bool]] = [
    ("step_scheduler.max_steps", lim.MAX_STEPS, put("step_scheduler.max_steps"), True),
    ("step_scheduler.num_epochs", lim.MAX_EPOCHS, put("step_scheduler.num_epochs"), True),
    ("step_scheduler.global_batch_size", lim.MAX_GLOBAL_BATCH,
     put("step_scheduler.global_batch_size"), True),
    ("step_scheduler.local_batch_size", lim.MAX_LOCAL_BATCH,
     put("step_scheduler.local_batch_size", dataloader__batch_size=None, **NO_GLOBAL), True),
    ("step_scheduler.grad_accumulation_steps", lim.MAX_GRAD_ACCUMULATION,
     put("step_scheduler.grad_accumulation_steps", dataloader__batch_size=1, **NO_GLOBAL), True),
    ("step_scheduler.val_check_interval", lim.MAX_STEPS,
     put("step_scheduler.val_check_interval"), True),
    ("step_scheduler.checkpoint_interval", lim.MAX_STEPS,
     put("step_scheduler.ckpt_every_steps"), True),  # AutoModel's name, folded
    ("step_scheduler.log_interval", lim.MAX_STEPS, put("step_scheduler.log_interval"), True),
    ("dist_env.timeout_minutes", lim.MAX_TIMEOUT_MINUTES, put("dist_env.timeout_minutes"), True),
    ("packed_sequence.packed_sequence_size", lim.MAX_SEQ_LENGTH,
     put("packed_sequence.packed_sequence_size"), True),
    ("packed_sequence.max_packs", lim.MAX_DATASET_SAMPLES, put("packed_sequence.max_packs"), True),
    ("dataloader.batch_size", lim.MAX_LOCAL_BATCH, put("dataloader.batch_size", **NO_GLOBAL),
     True),
    ("dataloader.num_workers", lim.MAX_DATALOADER_WORKERS, put("dataloader.num_workers"), True),
    ("validation_dataloader.batch_size", lim.MAX_LOCAL_BATCH,
     put("validation_dataloader.batch_size"), True),
    ("validation_dataloader.num_workers", lim.MAX_DATALOADER_WORKERS,
     put("validation_dataloader.num_workers"), True),
    ("dataset.max_seq_length", lim.MAX_SEQ_LENGTH, put("dataset.max_seq_length"), True),
    ("peft.dim", lim.MAX_LORA_RANK, put("peft.dim"), True),
    ("peft.alpha", lim.MAX_LORA_ALPHA, put("peft.alpha"), True),
    ("qat.fake_quant_after_n_steps", lim.MAX_STEPS, put("qat.fake_quant_after_n_steps"), True),
    ("qat.groupsize", lim.MAX_QUANT_GROUP_SIZE, put("qat.groupsize"), True),
    ("lr_scheduler.warmup_steps", lim.MAX_STEPS,
     put("lr_scheduler.warmup_steps", step_scheduler__max_steps=lim.MAX_STEPS), True),
    ("lr_scheduler.max_steps", lim.MAX_STEPS, put("lr_scheduler.max_steps"), True),
    # the default 10 measured steps then make too many: refused at measured_steps
    ("benchmark.warmup_steps", lim.MAX_STEPS, bench("benchmark.warmup_steps"), False),
    # with one warm-up step, MAX_STEPS in all
    ("benchmark.measured_steps", lim.MAX_STEPS - 1,
     bench("benchmark.measured_steps", benchmark__warmup_steps=1), True),
    ("benchmark.peak_tflops", lim.MAX_PEAK_TFLOPS, bench("benchmark.peak_tflops"), True),
    # the job named is not there: only the step's own bound is asserted
    ("restore_from.step", lim.MAX_STEPS, put("restore_from.step", restore_from__job="run-1"),
     False),
    ("distributed.dp_size", lim.MAX_PARALLEL_SIZE, put("distributed.dp_size"), False),
    # two stages on two ranks (the tiny model's 2 layers and 4 rows refuse the values too)
    ("distributed.pipeline.pp_microbatch_size", lim.MAX_LOCAL_BATCH,
     put("distributed.pipeline.pp_microbatch_size", distributed__pp_size=2), False),
    ("distributed.pipeline.layers_per_stage", lim.MAX_MODEL_SIZES["num_hidden_layers"],
     put("distributed.pipeline.layers_per_stage", distributed__pp_size=2), False),
    ("distributed.fsdp2_backward_prefetch_depth", lim.MAX_MODEL_SIZES["num_hidden_layers"],
     put("distributed.fsdp2_backward_prefetch_depth"), True),
    ("distributed.fsdp2_forward_prefetch_depth", lim.MAX_MODEL_SIZES["num_hidden_layers"],
     put("distributed.fsdp2_forward_prefetch_depth"), True),
    ("distributed.bucket_cap_mb", lim.MAX_BUCKET_CAP_MB,
     put("distributed.bucket_cap_mb", distributed__strategy="ddp"), True),
]  # fmt: skip


def _past(maximum: int | float) -> int | float:
    return maximum + 1


def _named(maximum: int | float, err: Any) -> bool:
    """Whether the error's message or fix names the maximum (as written, or as an integer)."""
    shown = {str(maximum), str(int(maximum))}
    return any(text in f"{err.msg} {err.fix}" for text in shown)


def _resources(loc: str) -> dict[str, int]:
    """dp_size at its maximum needs as many ranks; a pipeline, two."""
    if loc == "distributed.dp_size":
        return {"nnodes": 1024, "nproc_per_node": 64}
    return {"nproc_per_node": 2} if loc.startswith("distributed.pipeline") else {}


def _past_a_maximum(err: Any) -> bool:
    return "at most" in err.msg or "less than or equal" in err.msg


@pytest.mark.parametrize(("loc", "maximum", "edit", "valid"), BOUNDED, ids=[c[0] for c in BOUNDED])
def test_the_maximum_is_accepted_and_one_past_it_refused_at_the_field(
    validate, recipe, loc, maximum, edit, valid
):
    at_most = copy.deepcopy(recipe)
    edit(at_most, maximum)
    result = validate(at_most, **_resources(loc))
    assert not [str(e) for e in result.errors if e.loc == loc and _past_a_maximum(e)]
    if valid:
        assert result.valid, [str(e) for e in result.errors]
    edit(recipe, _past(maximum))
    err = error_at(validate(recipe, **_resources(loc)), loc)
    assert _past_a_maximum(err) and _named(maximum, err), str(err)


@pytest.mark.parametrize("name", SIZE_FIELDS)
def test_every_parallel_size_has_a_maximum(name):
    assert size_errors(ParallelismSizes(**{name: lim.MAX_PARALLEL_SIZE})) == []
    (err,) = size_errors(ParallelismSizes(**{name: lim.MAX_PARALLEL_SIZE + 1}))
    assert err.loc == f"distributed.{name}" and _named(lim.MAX_PARALLEL_SIZE, err)


def test_the_world_size_has_a_maximum(validate, recipe):
    """nnodes x nproc_per_node: the request schema allows fewer; a direct call is bounded too."""
    err = error_at(validate(recipe, nnodes=1025, nproc_per_node=64), "resources.nnodes")
    assert _named(lim.MAX_WORLD_SIZE, err) and "65600" in err.msg


@pytest.mark.parametrize("section", ["dataset", "validation_dataset"])
@pytest.mark.parametrize(
    ("key", "maximum"),
    [("max_seq_length", lim.MAX_SEQ_LENGTH), ("seq_length", lim.MAX_SEQ_LENGTH),
     ("limit_dataset_samples", lim.MAX_DATASET_SAMPLES),
     ("num_samples", lim.MAX_DATASET_SAMPLES), ("vocab_size", lim.MAX_VOCAB_SIZE)],
)  # fmt: skip
def test_every_numeric_dataset_keyword_has_a_maximum(section, key, maximum):
    assert check_dataset_values({key: maximum}, section) == []
    (err,) = check_dataset_values({key: maximum + 1}, section)
    assert err.loc == f"{section}.{key}" and _named(maximum, err)


def test_a_micro_batch_holds_at_most_max_micro_batch_tokens(validate, recipe):
    """Rows x sequence length on one rank: what the activation estimate multiplies."""
    recipe["step_scheduler"].pop("global_batch_size")
    recipe["dataloader"]["batch_size"] = 2**10
    recipe["dataset"]["max_seq_length"] = lim.MAX_MICRO_BATCH_TOKENS // 2**10
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    recipe["dataset"]["max_seq_length"] += 1
    err = error_at(validate(recipe), "dataloader.batch_size")
    assert "at most 16777216 (2**24)" in err.msg and "at most 1023" in err.fix


def test_packed_rows_count_at_their_pack_size(validate, recipe):
    recipe["step_scheduler"].pop("global_batch_size")
    recipe["dataloader"]["batch_size"] = 8
    recipe["packed_sequence"] = {"packed_sequence_size": lim.MAX_SEQ_LENGTH}
    err = error_at(validate(recipe), "dataloader.batch_size")
    assert str(8 * lim.MAX_SEQ_LENGTH) in err.msg


def test_a_derived_local_batch_has_the_maximum_of_a_given_one(validate, recipe):
    """global / (dp x accumulation) with no batch size given."""
    recipe["dataloader"].pop("batch_size")
    recipe["step_scheduler"].update(
        global_batch_size=lim.MAX_GLOBAL_BATCH, grad_accumulation_steps=1
    )
    err = error_at(validate(recipe), "dataloader.batch_size")
    assert str(lim.MAX_GLOBAL_BATCH) in err.msg and _named(lim.MAX_LOCAL_BATCH, err)


def test_a_derived_global_batch_has_the_maximum_of_a_given_one(validate, recipe):
    """local x dp x accumulation with no global batch given."""
    recipe["step_scheduler"].pop("global_batch_size")
    recipe["dataloader"]["batch_size"] = 2
    recipe["step_scheduler"]["grad_accumulation_steps"] = lim.MAX_GRAD_ACCUMULATION
    err = error_at(validate(recipe), "step_scheduler.grad_accumulation_steps")
    assert str(2 * lim.MAX_GRAD_ACCUMULATION) in err.msg and _named(lim.MAX_GLOBAL_BATCH, err)


def test_a_benchmark_runs_at_most_max_steps_in_all(validate, recipe):
    bench("benchmark.measured_steps", benchmark__warmup_steps=5)(recipe, lim.MAX_STEPS)
    err = error_at(validate(recipe), "benchmark.measured_steps")
    assert _named(lim.MAX_STEPS, err) and str(lim.MAX_STEPS - 5) in err.fix
