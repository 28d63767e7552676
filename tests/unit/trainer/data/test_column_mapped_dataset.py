"""ColumnMappedTextInstructionDataset on CSV, JSON and a `save_to_disk` directory: the mask is
exactly ` answer</s>` (or every token, or the assistant turn with the chat template),
truncation keeps the answer, limits apply, a missing column is named."""

from __future__ import annotations

import json

import pytest
from sample_text import context_of, targets_of
from sft_fixtures import instruction_rows, natural_instruction_rows, write_csv

from trainer.data.column_mapped import ColumnMappedTextInstructionDataset as Mapped
from trainer.errors import TrainerError

QA = {"question": "instruction", "answer": "output"}
NATURAL = {"context": "definition", "question": "inputs", "answer": "targets"}


def test_csv_question_answer_trains_on_the_answer_only(tmp_path, tok):
    rows = instruction_rows(6)
    ds = Mapped(str(write_csv(tmp_path / "qa.csv", rows)), QA, tok)
    for i, row in enumerate(rows):
        prompt = [tok.bos_token_id] + tok(row["instruction"], add_special_tokens=False)["input_ids"]
        answer = tok(" " + row["output"], add_special_tokens=False)["input_ids"] + [
            tok.eos_token_id
        ]
        assert ds[i] == {
            "input_ids": prompt + answer,
            "loss_mask": [0] * len(prompt) + [1] * len(answer),
        }


def test_json_context_question_answer_and_the_full_sequence_loss(tmp_path, tok):
    rows = natural_instruction_rows(4)
    path = tmp_path / "natural.json"
    path.write_text(json.dumps(rows))
    sample = Mapped(str(path), NATURAL, tok)[0]
    assert context_of(tok, sample) == f"<s>Reverse the digits. {rows[0]['inputs']}"
    assert targets_of(tok, sample) == f" {rows[0]['targets']}</s>"
    everything = Mapped(str(path), NATURAL, tok, answer_only_loss_mask=False)[0]
    assert everything["input_ids"] == sample["input_ids"] and all(everything["loss_mask"])


def test_the_chat_template_path_trains_on_the_assistant_turn(tmp_path, tok):
    rows = natural_instruction_rows(2)
    path = tmp_path / "natural.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sample = Mapped(str(path), NATURAL, tok, use_hf_chat_template=True)[0]
    assert context_of(tok, sample) == (
        f"<|system|>Reverse the digits.<|end|><|user|>{rows[0]['inputs']}<|end|><|assistant|>"
    )
    assert targets_of(tok, sample) == f"{rows[0]['targets']}<|end|>"


def test_truncation_drops_prompt_tokens_and_keeps_the_answer(tmp_path, tok):
    rows = instruction_rows(3)
    rows[0]["instruction"] = "Reverse " + "1 " * 60 + "23:"
    path = str(write_csv(tmp_path / "qa.csv", rows))
    cut = Mapped(path, QA, tok, seq_length=20, truncation="longest_first")[0]
    assert len(cut["input_ids"]) == 20
    assert targets_of(tok, cut) == f" {rows[0]['output']}</s>"
    assert len(Mapped(path, QA, tok, seq_length=20)[0]["input_ids"]) > 20  # do_not_truncate


def test_a_save_to_disk_dataset_dict_its_split_and_the_limit(tmp_path, tok):
    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(instruction_rows(10)),
            "validation": datasets.Dataset.from_list(instruction_rows(5, seed=9)),
        }
    ).save_to_disk(str(saved))
    val = Mapped(str(saved), QA, tok, split="validation[1:]", limit_dataset_samples=2)
    assert len(val) == 2
    assert context_of(tok, val[0]) == "<s>" + instruction_rows(5, seed=9)[1]["instruction"]
    with pytest.raises(TrainerError, match=r"no split 'test'; it has \['train', 'validation'\]"):
        Mapped(str(saved), QA, tok, split="test")


def test_a_list_of_files_is_one_dataset(tmp_path, tok):
    a = write_csv(tmp_path / "a.csv", instruction_rows(3))
    b = write_csv(tmp_path / "b.csv", instruction_rows(2, seed=5))
    assert len(Mapped([str(a), str(b)], QA, tok)) == 5


def test_a_missing_column_names_the_row_and_the_columns_there(tmp_path, tok):
    path = write_csv(tmp_path / "qa.csv", instruction_rows(2))
    with pytest.raises(
        TrainerError, match=r"qa.csv: row 1: no column 'answer_text'.*\['instruction', 'output'\]"
    ):
        Mapped(str(path), {"question": "instruction", "answer": "answer_text"}, tok)
