"""The agent-trace and xLAM builders' specs: AutoModel's recipe blocks (`agent/*.yaml`,
`gemma/functiongemma_xlam.yaml`) validate, with their hub names, revision and template
file; bad values are refused at their field; the ignored keywords warn."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at
from sft_fixtures import TOOL_TEMPLATE

from jobs.recipe.targets.table import TARGETS

LLM = "nemo_automodel.components.datasets.llm"
AGENT = f"{LLM}.agent_chat.make_agent_chat_dataset"
XLAM = f"{LLM}.xlam.make_xlam_dataset"


def _errors(result):
    return [str(e) for e in result.errors]


def test_the_agent_recipe_blocks_validate(validate, recipe, data_root):
    template = data_root / "agent.jinja"
    template.write_text(TOOL_TEMPLATE)
    recipe["dataset"] = {
        "_target_": AGENT, "dataset_name": "julien-c/synthtraces",
        "revision": "refs/convert/parquet", "filter_no_assistant": True,
        "filter_overlong": True, "trim_incomplete_last_turn": True, "split": "train[64:]",
        "chat_template": str(template), "seq_length": 8192, "truncation": True,
        "truncate_history": True,
    }  # fmt: skip
    recipe["validation_dataset"] = {
        "_target_": AGENT, "dataset_name": "llamafactory/glaive_toolcall_en",
        "split": "train[:256]", "limit_dataset_samples": 256, "seq_length": 4096,
    }  # fmt: skip
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert TARGETS[AGENT].name == "tuneyard.datasets.AgentChatDataset"
    assert result.recipe["dataset"]["chat_template"] == TOOL_TEMPLATE  # the file, read


def test_the_xlam_recipe_block_validates_and_warns_on_fp8(validate, recipe):
    recipe["dataset"] = {"_target_": XLAM, "dataset_name": "Salesforce/xlam-function-calling-60k",
                         "split": "train", "fp8": False}  # fmt: skip
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert any(w.loc == "dataset.fp8" and "ignored" in w.msg for w in result.warnings)


@pytest.mark.parametrize(
    ("section", "loc", "words"),
    [
        ({"_target_": AGENT}, "dataset", "exactly one of dataset_name"),
        ({"_target_": AGENT, "dataset_name": "a/b", "path": "x.jsonl"}, "dataset",
         "exactly one of dataset_name"),
        ({"_target_": AGENT, "dataset_name": "a/b", "filter_overlong": True}, "dataset",
         "give seq_length"),
        ({"_target_": AGENT, "dataset_name": "a/b", "revision": "../x"}, "dataset.revision",
         "branch, tag or commit"),
        ({"_target_": AGENT, "dataset_name": "a/b", "truncate_history": "yes"},
         "dataset.truncate_history", "boolean"),
        ({"_target_": AGENT, "dataset_name": "a/b", "train_on_last_turn_only": True},
         "dataset.train_on_last_turn_only", "takes no argument"),
        ({"_target_": XLAM, "limit_dataset_samples": 0}, "dataset.limit_dataset_samples",
         "greater than 0"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_at_their_field(validate, recipe, section, loc, words):
    recipe["dataset"] = section
    assert words in error_at(validate(recipe), loc).msg
