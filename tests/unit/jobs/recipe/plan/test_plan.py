"""`plan.build_plan` at the edges: with every number that feeds it at its maximum at once
(`jobs.recipe.load.limits`) the plan is valid JSON whose integers are exact and floats
finite, and one past any of those maxima is refused rather than planned."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from recipe_asserts import write_model_dir

from jobs.recipe.load import limits as lim

# The largest published dense decoder's sizes (a 405B Llama), in float32.
LARGEST = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
           "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
           "num_attention_heads": 128, "num_key_value_heads": 8, "tie_word_embeddings": False}  # fmt: skip
# nnodes x nproc_per_node = MAX_WORLD_SIZE ranks, all data parallel.
RANKS = {"nnodes": lim.MAX_WORLD_SIZE // 64, "nproc_per_node": 64}
ROWS = lim.MAX_MICRO_BATCH_TOKENS // lim.MAX_SEQ_LENGTH  # the longest sequences a rank holds
ACCUMULATION = lim.MAX_GLOBAL_BATCH // (ROWS * lim.MAX_WORLD_SIZE)


@pytest.fixture
def at_maxima(recipe: dict[str, Any], data_root) -> dict[str, Any]:
    out = copy.deepcopy(recipe)
    out["model"]["pretrained_model_name_or_path"] = str(write_model_dir(data_root / "big", LARGEST))
    out["step_scheduler"] = {
        "max_steps": lim.MAX_STEPS,
        "num_epochs": lim.MAX_EPOCHS,
        "global_batch_size": lim.MAX_GLOBAL_BATCH,
        "val_check_interval": lim.MAX_STEPS,
        "checkpoint_interval": lim.MAX_STEPS,
        "log_interval": lim.MAX_STEPS,
    }
    out["dataloader"] = {"batch_size": ROWS, "num_workers": lim.MAX_DATALOADER_WORKERS}
    out["dataset"]["max_seq_length"] = lim.MAX_SEQ_LENGTH
    out["peft"] = {"dim": lim.MAX_LORA_RANK, "alpha": lim.MAX_LORA_ALPHA}
    out["lr_scheduler"]["warmup_steps"] = lim.MAX_STEPS
    return out


def numbers(value: Any) -> Iterator[int | float]:
    if isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield value


def _stored_exactly(plan: dict[str, Any]) -> None:
    """Integers exact (and so within int64), floats finite: JSON any client reads back."""
    for number in numbers(plan):
        if isinstance(number, float):
            assert math.isfinite(number), plan
        else:
            assert abs(number) <= lim.MAX_PLAN_NUMBER < 2**63, plan
    json.dumps(plan, allow_nan=False)  # what the API answers and stores


# One past a maximum, each of the numbers the plan multiplies.
PAST: list[tuple[str, str, Any]] = [
    ("step_scheduler", "max_steps", lim.MAX_STEPS + 1),
    ("step_scheduler", "global_batch_size", lim.MAX_GLOBAL_BATCH + ROWS * lim.MAX_WORLD_SIZE),
    ("dataloader", "batch_size", ROWS + 1),
    ("dataset", "max_seq_length", lim.MAX_SEQ_LENGTH + 1),
    ("peft", "dim", lim.MAX_LORA_RANK + 1),
    ("distributed", "dp_size", lim.MAX_WORLD_SIZE + 1),
]


def test_the_plan_at_every_maximum_at_once_is_finite_and_exact(validate, at_maxima):
    """All at once: the largest model, the longest sequences, the largest batches and runs,
    the most ranks. The plan multiplies them (tokens, FLOPs, memory) and stays exact."""
    result = validate(at_maxima, **RANKS)
    assert result.valid, [str(e) for e in result.errors]
    plan = result.plan
    assert plan["world_size"] == lim.MAX_WORLD_SIZE
    assert plan["grad_accumulation_steps"] == ACCUMULATION
    assert plan["tokens_per_step"] == lim.MAX_GLOBAL_BATCH * lim.MAX_SEQ_LENGTH
    assert plan["estimate"] is not None  # the largest model's estimate is kept
    _stored_exactly(plan)
    for section, key, value in PAST:  # and these were the maxima: one past is refused
        past = copy.deepcopy(at_maxima)
        past[section][key] = value
        refused = validate(past, **RANKS)
        assert not refused.valid and refused.recipe is None
        assert any("at most" in e.msg or "less than or equal" in e.msg for e in refused.errors), (
            section,
            key,
            [str(e) for e in refused.errors],
        )
        _stored_exactly(refused.plan)
