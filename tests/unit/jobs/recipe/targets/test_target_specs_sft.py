"""The SFT datasets' and tokenizers' specs: AutoModel-shaped blocks validate, bad ones are
refused at their field. Blocks follow AutoModel's examples (`*_sft_hellaswag.yaml`,
`customizer/llama_3_2_1b_full_sft[_chat].yaml`, the column-mapped guide, the retrieval and
Megatron recipes' tokenizer blocks), with paths under the test data root."""

from __future__ import annotations

import dataclasses

import pytest
from recipe_asserts import error_at
from sft_fixtures import (
    TOOL_TEMPLATE,
    chat_rows,
    hellaswag_rows,
    instruction_rows,
    write_jsonl,
    write_parquet,
)

from jobs.recipe.targets.spec import TargetSpec
from jobs.recipe.targets.specs_sft import IGNORED, SPECS
from jobs.recipe.targets.table import TARGETS

LLM = "nemo_automodel.components.datasets.llm"
HELLASWAG = f"{LLM}.hellaswag.HellaSwag"
CHAT = f"{LLM}.chat_dataset.ChatDataset"
MAPPED = f"{LLM}.column_mapped_text_instruction_dataset.ColumnMappedTextInstructionDataset"
NEMO_TOKENIZER = "nemo_automodel.NeMoAutoTokenizer.from_pretrained"


@pytest.fixture
def files(data_root):
    return {
        "hellaswag": write_parquet(data_root / "hellaswag" / "train.parquet", hellaswag_rows(8)),
        "chat": write_jsonl(data_root / "chat" / "train.jsonl", chat_rows(6)),
        "pc": write_jsonl(data_root / "prompt_completion" / "train.jsonl", instruction_rows(6)),
    }


def _errors(result):
    return [str(e) for e in result.errors]


def test_the_hellaswag_recipe_block_validates(validate, recipe, files):
    recipe["dataset"] = {"_target_": HELLASWAG, "path_or_dataset": str(files["hellaswag"]),
                         "split": "train"}  # fmt: skip
    recipe["validation_dataset"] = {**recipe["dataset"], "split": "validation",
                                    "num_samples_limit": 64}  # fmt: skip
    recipe["packed_sequence"] = {"packed_sequence_size": 256}
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert result.recipe["dataset"]["_target_"] == HELLASWAG


def test_a_hub_named_hellaswag_validates_without_the_files(validate, recipe):
    recipe["dataset"] = {"_target_": HELLASWAG, "path_or_dataset": "rowan/hellaswag"}
    assert validate(recipe).valid, _errors(validate(recipe))


def test_the_chat_recipe_block_validates(validate, recipe, files):
    recipe["dataset"] = {"_target_": CHAT, "path_or_dataset_id": str(files["chat"]),
                         "split": "train", "seq_length": 2048, "chat_template": TOOL_TEMPLATE}  # fmt: skip
    recipe["validation_dataset"] = {**recipe["dataset"], "split": "validation"}
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert result.recipe["dataset"]["chat_template"] == TOOL_TEMPLATE


def test_the_column_mapped_recipe_block_validates(validate, recipe, files):
    recipe["dataset"] = {
        "_target_": MAPPED, "path_or_dataset_id": str(files["pc"]), "split": "train",
        "column_mapping": {"question": "instruction", "answer": "output"}, "seq_length": 2048,
        "answer_only_loss_mask": True, "padding": "do_not_pad", "truncation": "longest_first",
    }  # fmt: skip
    result = validate(recipe)
    assert result.valid, _errors(result)


def test_a_list_of_files_is_checked_file_by_file(validate, recipe, files, tmp_path):
    outside = write_jsonl(tmp_path / "outside" / "x.jsonl", instruction_rows(2))
    recipe["dataset"] = {"_target_": MAPPED, "path_or_dataset_id": [str(files["pc"]), str(outside)],
                         "column_mapping": {"question": "instruction", "answer": "output"}}  # fmt: skip
    assert (
        "outside the allowed roots"
        in error_at(validate(recipe), "dataset.path_or_dataset_id.1").msg
    )


@pytest.mark.parametrize(
    ("target", "key"),
    [(HELLASWAG, "path_or_dataset"), (CHAT, "path_or_dataset_id"), (MAPPED, "path_or_dataset_id")],
)
def test_a_path_escape_is_refused_at_the_path_keyword(validate, recipe, data_root, target, key):
    recipe["dataset"] = {"_target_": target, key: str(data_root / ".." / "etc" / "x.jsonl")}
    if target == MAPPED:
        recipe["dataset"]["column_mapping"] = {"question": "q", "answer": "a"}
    assert "'..'" in error_at(validate(recipe), f"dataset.{key}").msg


@pytest.mark.parametrize(
    ("section", "loc", "words"),
    [
        ({"_target_": HELLASWAG, "num_samples_limit": "all"}, "num_samples_limit", "integer"),
        ({"_target_": HELLASWAG, "num_samples_limit": 0}, "num_samples_limit", "greater than 0"),
        ({"_target_": HELLASWAG, "pad_to_max_length": "yes"}, "pad_to_max_length", "boolean"),
        ({"_target_": HELLASWAG, "split": "../train"}, "split", "not a path"),
        ({"_target_": HELLASWAG, "max_seq_length": 64}, "max_seq_length", "takes no argument"),
        ({"_target_": CHAT, "chat_template": "templates/llama.jinja"}, "chat_template",
         "outside the allowed roots"),  # a template file is read only inside the data roots
        ({"_target_": CHAT, "truncation": "sometimes"}, "truncation", "longest_first"),
        ({"_target_": CHAT, "shuffle_seed": 1.5}, "shuffle_seed", "integer"),
        ({"_target_": CHAT, "seq_length": -1}, "seq_length", "positive integer"),
        ({"_target_": MAPPED, "column_mapping": {"answer": "output"}}, "column_mapping",
         "context or question"),
        ({"_target_": MAPPED, "column_mapping": {"question": "q", "answer": 3}},
         "column_mapping.answer", "string"),
        ({"_target_": MAPPED, "column_mapping": {"prompt": "q", "answer": "a"}},
         "column_mapping.prompt", "unknown key"),
        ({"_target_": MAPPED, "column_mapping": {"question": "../q", "answer": "a"}},
         "column_mapping.question", "not a path"),
        ({"_target_": MAPPED, "answer_only_loss_mask": "true"}, "answer_only_loss_mask",
         "boolean"),
        ({"_target_": MAPPED, "limit_dataset_samples": 0}, "limit_dataset_samples",
         "positive integer"),
    ],
)  # fmt: skip
def test_a_wrong_keyword_or_type_is_refused_at_its_field(
    validate, recipe, files, section, loc, words
):
    path_key = "path_or_dataset" if section["_target_"] == HELLASWAG else "path_or_dataset_id"
    base = {path_key: str(files["pc"])}
    if section["_target_"] == MAPPED and "column_mapping" not in section:
        base["column_mapping"] = {"question": "instruction", "answer": "output"}
    recipe["dataset"] = {**base, **section}
    assert words in error_at(validate(recipe), f"dataset.{loc}").msg


def test_the_column_mapping_is_required(validate, recipe, files):
    recipe["dataset"] = {"_target_": MAPPED, "path_or_dataset_id": str(files["pc"])}
    assert "required" in error_at(validate(recipe), "dataset.column_mapping").msg


def test_limit_dataset_samples_is_hellaswags_num_samples_limit(validate, recipe, files):
    recipe["dataset"] = {"_target_": HELLASWAG, "path_or_dataset": str(files["hellaswag"]),
                         "limit_dataset_samples": 16}  # fmt: skip
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert result.recipe["dataset"]["num_samples_limit"] == 16


@pytest.mark.parametrize(
    "target",
    [
        "transformers.AutoTokenizer.from_pretrained",
        NEMO_TOKENIZER,
        "nemo_automodel._transformers.auto_tokenizer.NeMoAutoTokenizer.from_pretrained",
    ],
)
def test_a_tokenizer_section_validates(validate, recipe, model_dir, target):
    recipe["tokenizer"] = {"_target_": target, "pretrained_model_name_or_path": str(model_dir)}
    if "NeMo" in target:
        recipe["tokenizer"]["add_eos_token"] = False
    result = validate(recipe)
    assert result.valid, _errors(result)
    assert result.recipe["tokenizer"]["pretrained_model_name_or_path"] == str(model_dir)


@pytest.mark.parametrize(
    ("extra", "loc", "words"),
    [
        ({"trust_remote_code": True}, "trust_remote_code", "only when the model does"),
        ({"cache_dir": "/tmp"}, "cache_dir", "takes no argument"),
        ({"token": "hf_x"}, "token", "takes no argument"),
        ({"use_fast": "yes"}, "use_fast", "boolean"),
        ({"revision": "../../main"}, "revision", "not a path"),
        ({"padding_side": "middle"}, "padding_side", "'left' or 'right'"),
    ],
)
def test_a_bad_tokenizer_keyword_is_refused(validate, recipe, model_dir, extra, loc, words):
    recipe["tokenizer"] = {"_target_": NEMO_TOKENIZER,
                           "pretrained_model_name_or_path": str(model_dir), **extra}  # fmt: skip
    assert words in error_at(validate(recipe), f"tokenizer.{loc}").msg


def test_the_tokenizer_path_is_checked_against_the_data_roots(validate, recipe, tmp_path):
    recipe["tokenizer"] = {"_target_": NEMO_TOKENIZER,
                           "pretrained_model_name_or_path": str(tmp_path / "elsewhere")}  # fmt: skip
    msg = error_at(validate(recipe), "tokenizer.pretrained_model_name_or_path").msg
    assert "outside the allowed roots" in msg


def test_a_dataset_cannot_stand_in_the_tokenizer_section(validate, recipe, files):
    recipe["tokenizer"] = {"_target_": HELLASWAG, "path_or_dataset": str(files["hellaswag"])}
    assert "not a tokenizer" in error_at(validate(recipe), "tokenizer._target_").msg


def test_every_alias_resolves_to_a_spec_of_this_area():
    names = {s.name for s in SPECS}
    for alias in (HELLASWAG, CHAT, MAPPED, f"{LLM}.ChatDataset", NEMO_TOKENIZER):
        assert TARGETS[alias].name in names


def test_ignored_keywords_are_real_keywords_with_a_reason():
    for target in SPECS:
        for key, why in IGNORED.get(target.name, {}).items():
            assert key in target.params and why, (target.name, key)
    if "ignored" in {f.name for f in dataclasses.fields(TargetSpec)}:
        assert TARGETS[HELLASWAG].ignored == IGNORED["tuneyard.datasets.HellaSwag"]
