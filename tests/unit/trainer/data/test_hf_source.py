"""Loading and caching under the datasets: split slices, the tokenized-rows cache (a second
build tokenizes nothing; a change of file, arguments or tokenizer does), bad input named."""

from __future__ import annotations

import os

import pytest
from sft_fixtures import TOOL_TEMPLATE, chat_rows, instruction_rows, write_csv, write_jsonl

from trainer.data import hf_source
from trainer.data.chat import ChatDataset
from trainer.data.column_mapped import ColumnMappedTextInstructionDataset as Mapped
from trainer.errors import TrainerError

QA = {"question": "instruction", "answer": "output"}


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ("train", list(range(10))),
        ("train[:3]", [0, 1, 2]),
        ("validation[7:]", [7, 8, 9]),
        ("train[-2:]", [8, 9]),
        ("train[:30%]", [0, 1, 2]),
        ("train[20%:40%]", [2, 3]),
    ],
)
def test_split_slices(split, expected):
    assert list(hf_source.slice_positions(hf_source.parse_split(split), 10)) == expected


@pytest.mark.parametrize("split", ["train[a:b]", "train[1]", "../train"])
def test_a_bad_split_is_a_data_error(split):
    with pytest.raises(TrainerError, match="dataset.split"):
        hf_source.slice_positions(hf_source.parse_split(split), 10)


@pytest.fixture
def tokenize_runs(monkeypatch):
    """How many times rows were tokenized (not read from the cache)."""
    calls = []
    real = hf_source._run_rows

    def counting(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_source, "_run_rows", counting)
    return calls


def test_a_second_build_reads_the_cache_and_changes_rebuild(tmp_path, tok, tokenize_runs):
    path = write_csv(tmp_path / "qa.csv", instruction_rows(8))
    first = Mapped(str(path), QA, tok)
    again = Mapped(str(path), QA, tok)
    assert len(tokenize_runs) == 1
    assert [again[i] for i in range(8)] == [first[i] for i in range(8)]
    assert again.rows.cache_files[0]["filename"].startswith(str(hf_source.cache_dir()))
    Mapped(str(path), QA, tok, answer_only_loss_mask=False)  # another argument
    Mapped(str(path), QA, tok, split="train[:4]")  # another selection
    assert len(tokenize_runs) == 3
    write_csv(path, instruction_rows(8, seed=4))  # the file changed
    os.utime(path, ns=(1, 1))
    assert Mapped(str(path), QA, tok)[0] != first[0]
    assert len(tokenize_runs) == 4


def test_the_cache_key_follows_the_tokenizer_chat_template(tmp_path, tok, tokenize_runs):
    path = str(write_jsonl(tmp_path / "chat.jsonl", chat_rows(4)))
    plain = ChatDataset(path, tok, chat_template=TOOL_TEMPLATE)
    ChatDataset(path, tok, chat_template=TOOL_TEMPLATE)
    other = ChatDataset(path, tok, chat_template=TOOL_TEMPLATE.replace("<call>", "<tool_call>"))
    assert len(tokenize_runs) == 2
    assert plain[0]["input_ids"] != other[0]["input_ids"]


def test_a_failed_build_leaves_no_cache_file(tmp_path, tok):
    rows = instruction_rows(4)
    rows[3]["output"] = ""
    path = write_csv(tmp_path / "qa.csv", rows)
    with pytest.raises(TrainerError):
        Mapped(str(path), {"question": "instruction", "answer": "missing"}, tok)
    assert not list(hf_source.cache_dir().glob("*.arrow"))


def test_unknown_suffixes_and_mixed_formats_are_refused(tmp_path, tok):
    text = tmp_path / "data.txt"
    text.write_text("x")
    csv = write_csv(tmp_path / "qa.csv", instruction_rows(2))
    for value in (
        str(text),
        [str(csv), str(write_jsonl(tmp_path / "qa.jsonl", instruction_rows(2)))],
    ):
        with pytest.raises(TrainerError, match="read as one format from the suffix"):
            Mapped(value, QA, tok)
