"""Extreme numbers anywhere a recipe (or the request around it) carries one: every submit
answers 201 or 422, never a 5xx, and each 201 stores exactly one job, each 422 none. The
counts the plan multiplies (steps, batches, sequence length, LoRA rank, parallel sizes)
have realistic maxima (`jobs.recipe.load.limits`), so every extreme value there is a 422.

The fields are every numeric field of the fixed sections (read from the schema, so a new
one is covered without editing this file), the numeric keywords of the target sections a
fine-tuning recipe uses (model, dataset, optimizer, scheduler), the distributed sizes and
the request's own numbers. The values are the edges of every range that matters: zero and
negatives, int32 and float64's exact-integer edge, int64's, floats far past any realistic
size and the smallest subnormal. NaN and the infinities go in as YAML (JSON has none).
"""

from __future__ import annotations

import copy
import typing
from collections import Counter
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from jobs.recipe.load.schema import FIXED_SECTIONS, PeftSection
from jobs.store.tables import Job, Project

EXTREMES: list[Any] = [
    0,
    -1,
    2**31,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**63),
    2**64,
    1e15,
    1e308,
    -1e308,
    5e-324,
    0.5,
    True,
]
NOT_FINITE = [".nan", ".inf", "-.inf"]

# Numeric keywords of the target sections in use (the fixed sections' come from the schema).
TARGET_NUMBERS = [
    ("dataset", "max_seq_length"),
    ("dataset", "limit_dataset_samples"),
    ("optimizer", "lr"),
    ("optimizer", "weight_decay"),
    ("optimizer", "eps"),
    ("optimizer", "betas"),
    ("lr_scheduler", "warmup_steps"),
    ("lr_scheduler", "min_lr"),
    ("lr_scheduler", "max_steps"),
    ("distributed", "tp_size"),
    ("distributed", "cp_size"),
    ("distributed", "pp_size"),
    ("distributed", "ep_size"),
    ("distributed", "dp_size"),
    ("distributed", "dp_replicate_size"),
    ("distributed", "fsdp2_backward_prefetch_depth"),
    ("distributed", "fsdp2_forward_prefetch_depth"),
    ("distributed", "pipeline", "pp_microbatch_size"),
    ("distributed", "pipeline", "layers_per_stage"),
    ("restore_from", "step"),
]
# Counts the plan multiplies, none of whose extremes is realistic: each value is a 422.
# (The parallel sizes are too, but one rank refuses any size past 1 already.)
PLAN_COUNTS = [
    ("step_scheduler", "max_steps"),
    ("step_scheduler", "num_epochs"),
    ("step_scheduler", "global_batch_size"),
    ("step_scheduler", "local_batch_size"),
    ("step_scheduler", "grad_accumulation_steps"),
    ("step_scheduler", "val_check_interval"),
    ("step_scheduler", "checkpoint_interval"),
    ("step_scheduler", "log_interval"),
    ("dataloader", "batch_size"),
    ("validation_dataloader", "batch_size"),
    ("dataset", "max_seq_length"),
    ("peft", "dim"),
    ("lr_scheduler", "max_steps"),
]
# The batch sizes a given one must agree with, left out (derived) so that only its own
# value can refuse it.
DERIVED = {
    ("step_scheduler", "local_batch_size"): [("step_scheduler", "global_batch_size"),
                                             ("dataloader", "batch_size")],
    ("step_scheduler", "grad_accumulation_steps"): [("step_scheduler", "global_batch_size")],
    ("dataloader", "batch_size"): [("step_scheduler", "global_batch_size")],
}  # fmt: skip
REQUEST_NUMBERS = [
    ("resources", "nnodes"),
    ("resources", "nproc_per_node"),
    ("priority",),
    ("max_attempts",),
]
SCHEDULER = {"_target_": "tuneyard.schedulers.CosineAnnealingWarmup", "warmup_steps": 2}


def _is_numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(_is_numeric(arg) for arg in typing.get_args(annotation))


def schema_numbers() -> list[tuple[str, ...]]:
    sections = {**FIXED_SECTIONS, "peft": PeftSection}
    return sorted(
        (name, field)
        for name, section in sections.items()
        for field, info in section.model_fields.items()
        if _is_numeric(info.annotation)
    )


FIELDS = schema_numbers() + TARGET_NUMBERS


def _recipe_with(recipe: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    recipe = copy.deepcopy(recipe)
    recipe.setdefault("lr_scheduler", dict(SCHEDULER))
    if path == ("restore_from", "step"):  # a step goes with the job it names
        recipe["restore_from"] = {"job": "some-run"}
    section = recipe
    for key in path[:-1]:
        section = section.setdefault(key, {})
    if path == ("optimizer", "betas"):
        value = [value, 0.999]
    section[path[-1]] = value
    return recipe


def _job_count(stack) -> int:
    with stack.session() as session:
        return session.scalar(
            select(func.count()).select_from(Job).join(Project).where(Project.name == stack.project)
        )


def _submit_all(client, stack, bodies: list[dict[str, Any]]) -> Counter:
    """Submit each body; the answers' statuses, after checking each is 201 or 422 and that
    the project gained one job per 201."""
    before = _job_count(stack)
    statuses: Counter = Counter()
    for body in bodies:
        answer = client.post("/v1/jobs", json=body, headers=stack.headers())
        assert answer.status_code in (201, 422), (body, answer.status_code, answer.text[:500])
        if answer.status_code == 201:
            assert answer.json()["status"] == "queued"
        else:
            assert answer.json()["errors"], answer.text
        statuses[answer.status_code] += 1
    assert _job_count(stack) - before == statuses[201]
    return statuses


def test_the_schema_fields_are_found():
    """The walk of the schema sees the numeric fields (a broken walk would test nothing)."""
    assert {("step_scheduler", "max_steps"), ("peft", "dim"), ("peft", "alpha")} <= set(FIELDS)
    assert ("checkpoint", "enabled") not in FIELDS  # a bool is not a number field
    assert set(PLAN_COUNTS) <= set(FIELDS)  # each is also driven through the 201-or-422 test


@pytest.mark.parametrize("path", FIELDS, ids=".".join)
def test_extreme_numbers_in_a_recipe_answer_201_or_422(client, stack, body, path):
    bodies = [{**body, "recipe": _recipe_with(body["recipe"], path, v)} for v in EXTREMES]
    statuses = _submit_all(client, stack, bodies)
    assert statuses[422] >= 1  # at least the values past int64 are refused


@pytest.mark.parametrize("path", PLAN_COUNTS, ids=".".join)
def test_extreme_plan_counts_answer_422(client, stack, body, path):
    """Zero, negatives, past the maximum, not an integer: none is a count a job can run."""
    recipe = copy.deepcopy(body["recipe"])
    for section, key in DERIVED.get(path, []):
        del recipe[section][key]
    bodies = [{**body, "recipe": _recipe_with(recipe, path, v)} for v in EXTREMES]
    assert _submit_all(client, stack, bodies) == Counter({422: len(EXTREMES)})


@pytest.mark.parametrize("path", FIELDS[::3], ids=".".join)
def test_nan_and_infinities_in_yaml_answer_422(client, stack, body, path):
    bodies = []
    for token in NOT_FINITE:
        text = yaml.safe_dump(_recipe_with(body["recipe"], path, 123456789))
        assert text.count("123456789") == 1
        bodies.append({**body, "recipe": None, "recipe_yaml": text.replace("123456789", token)})
    assert _submit_all(client, stack, bodies) == Counter({422: len(NOT_FINITE)})


@pytest.mark.parametrize("path", REQUEST_NUMBERS, ids=".".join)
def test_extreme_numbers_in_the_request_answer_201_or_422(client, stack, body, path):
    bodies = []
    for value in EXTREMES:
        sent = copy.deepcopy(body)
        target = sent
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
        bodies.append(sent)
    _submit_all(client, stack, bodies)


def test_every_number_at_its_largest_at_once_answers_201_or_422(client, stack, body):
    """The plan multiplies the numbers together (tokens, FLOPs, memory): all at int64's edge
    at once, and each at the largest value it accepts alone."""
    huge = body["recipe"]
    for path in FIELDS:
        huge = _recipe_with(huge, path, 2**63 - 1)
    large = body["recipe"]
    for path in FIELDS:
        candidate = _recipe_with(large, path, 2**62)
        answer = client.post(
            "/v1/jobs:validate", json={**body, "recipe": candidate}, headers=stack.headers()
        )
        assert answer.status_code in (200, 422), answer.text[:500]
        if answer.status_code == 200:
            large = candidate
    _submit_all(client, stack, [{**body, "recipe": huge}, {**body, "recipe": large}])
