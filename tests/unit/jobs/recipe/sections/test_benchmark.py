"""The benchmark recipe (`recipe: llm_benchmark`): names, the `benchmark:` section, the step
counts it derives, checkpoints off by default, and the typed `Recipe.benchmark`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Benchmark, Recipe, recipe_sections

AM = "nemo_automodel"
BENCH_CLASS = "BenchmarkingRecipeForNextTokenPrediction"
EXAMPLES = Path(__file__).resolve().parents[5] / "examples"


@pytest.fixture
def bench(recipe: dict[str, Any]) -> dict[str, Any]:
    """The test recipe as an AutoModel benchmark recipe writes it (max_steps, warmup_steps)."""
    recipe["recipe"] = BENCH_CLASS
    recipe["benchmark"] = {"warmup_steps": 3, "peak_tflops": 989}
    recipe["step_scheduler"] = {"max_steps": 8, "global_batch_size": 8, "num_epochs": 1}
    recipe["dataset"] = {"_target_": "tuneyard.datasets.MockDataset", "vocab_size": 128,
                         "seq_length": 16}  # fmt: skip
    recipe.pop("lr_scheduler")
    return recipe


def _valid(result) -> Recipe:
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed is not None
    return result.typed


@pytest.mark.parametrize(
    "name",
    [
        "llm_benchmark",
        BENCH_CLASS,
        f"{AM}.recipes.llm.benchmark.{BENCH_CLASS}",
        {"_target_": f"{AM}.recipes.llm.benchmark.{BENCH_CLASS}"},
    ],
)
def test_benchmark_recipe_names_are_accepted(validate, bench, name):
    bench["recipe"] = name
    assert _valid(validate(bench)).recipe == "llm_benchmark"


def test_measured_steps_come_from_max_steps(validate, bench):
    typed = _valid(validate(bench))
    assert typed.benchmark == Benchmark(warmup_steps=3, measured_steps=5, peak_tflops=989.0)
    assert typed.step_scheduler.max_steps == 8


def test_max_steps_comes_from_warmup_and_measured_steps(validate, bench):
    bench["step_scheduler"].pop("max_steps")
    bench["benchmark"]["measured_steps"] = 4
    typed = _valid(validate(bench))
    assert typed.step_scheduler.max_steps == 7
    assert typed.benchmark is not None and typed.benchmark.measured_steps == 4


def test_a_bare_benchmark_gets_default_counts(validate, bench):
    bench["step_scheduler"].pop("max_steps")
    bench.pop("benchmark")
    typed = _valid(validate(bench))
    assert typed.benchmark == Benchmark(warmup_steps=2, measured_steps=10, peak_tflops=None)
    assert typed.step_scheduler.max_steps == 12


def test_max_steps_must_leave_measured_steps(validate, bench):
    bench["step_scheduler"]["max_steps"] = 3
    error = error_at(validate(bench), "step_scheduler.max_steps")
    assert "no measured step" in error.msg and "above 3" in error.fix


def test_disagreeing_counts_are_refused(validate, bench):
    bench["benchmark"]["measured_steps"] = 4
    error = error_at(validate(bench), "step_scheduler.max_steps")
    assert "3 + 4" in error.msg and "max_steps: 7" in error.fix


@pytest.mark.parametrize("key", ["warmup_steps", "measured_steps"])
@pytest.mark.parametrize("value", [0, -1])
def test_step_counts_must_be_positive(validate, bench, key, value):
    bench["step_scheduler"].pop("max_steps")
    bench["benchmark"][key] = value
    error_at(validate(bench), f"benchmark.{key}")


def test_an_unknown_benchmark_key_is_refused_with_a_suggestion(validate, bench):
    bench["benchmark"]["warmpu_steps"] = 3
    error = error_at(validate(bench), "benchmark.warmpu_steps")
    assert "warmup_steps" in error.fix


def test_a_training_recipe_ignores_the_section_with_a_warning(validate, recipe):
    recipe["benchmark"] = {"warmup_steps": 2}
    result = validate(recipe)
    assert result.valid and result.typed.benchmark is None
    assert [w.loc for w in result.warnings] == ["benchmark"]


def test_checkpoints_are_off_unless_asked_for(validate, bench):
    assert _valid(validate(bench)).checkpoint.enabled is False
    bench["checkpoint"] = {"enabled": True}
    assert _valid(validate(bench)).checkpoint.enabled is True


def test_epochs_validation_and_profiler_keys_are_reported_ignored(validate, bench):
    bench["benchmark"].update(nsys_start=-1, nsys_end=-1, nsys_ranks=[], num_nodes=1)
    bench["step_scheduler"]["val_every_steps"] = 1000
    result = validate(bench)
    typed = _valid(result)
    warned = {w.loc for w in result.warnings}
    assert {"benchmark.nsys_start", "benchmark.num_nodes", "step_scheduler.num_epochs"} <= warned
    assert "step_scheduler.val_check_interval" in warned
    assert typed.step_scheduler.num_epochs is None
    assert typed.step_scheduler.val_check_interval is None


def test_the_typed_benchmark_round_trips(validate, bench):
    typed = _valid(validate(bench))
    assert Recipe.from_json(typed.to_json()) == typed
    assert typed.to_json()["benchmark"] == {"warmup_steps": 3, "measured_steps": 5,
                                            "peak_tflops": 989.0}  # fmt: skip


def test_a_stored_benchmark_validates_again_unchanged(validate, bench):
    typed = _valid(validate(bench))
    again = _valid(validate(recipe_sections(typed.to_json())))
    assert again == typed


def test_other_recipes_have_no_benchmark(validate, recipe):
    typed = _valid(validate(recipe))
    assert typed.benchmark is None
    assert Recipe.from_json(typed.to_json()) == typed


def test_the_shipped_benchmark_example_validates(validate, model_dir):
    example = EXAMPLES / "llm_benchmark" / "tiny_llama_mock.yaml"
    overrides = ["--model.pretrained_model_name_or_path", str(model_dir)]
    typed = _valid(validate(example, overrides, nproc_per_node=2))
    assert typed.recipe == "llm_benchmark" and typed.step_scheduler.max_steps == 10
    assert typed.checkpoint.enabled is False
