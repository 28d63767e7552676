"""HellaSwag on its real column layout: parquet, JSONL and a hub-cache repo; the loss mask is
exactly the correct ending and EOS; splits slice, the limit limits, unlabeled rows are refused."""

from __future__ import annotations

import pytest
from fake_hub import write_hub_dataset
from sample_text import context_of, targets_of
from sft_fixtures import hellaswag_rows, write_jsonl, write_parquet

from trainer.data.hellaswag import HellaSwag
from trainer.errors import TrainerError


def _gold(row):
    return row["endings"][int(row["label"])]


def test_parquet_rows_train_on_the_correct_ending_only(tmp_path, tok):
    rows = hellaswag_rows(12)
    ds = HellaSwag(str(write_parquet(tmp_path / "train.parquet", rows)), tok)
    assert len(ds) == 12
    for row, sample in zip(rows, (ds[i] for i in range(len(ds))), strict=False):
        prompt = [tok.bos_token_id] + tok(row["ctx"], add_special_tokens=False)["input_ids"]
        ending = tok(" " + _gold(row), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert sample["input_ids"] == prompt + ending
        assert sample["loss_mask"] == [0] * len(prompt) + [1] * len(ending)
        assert targets_of(tok, sample) == " " + _gold(row) + "</s>"


def test_jsonl_split_slice_and_limit(tmp_path, tok):
    rows = hellaswag_rows(20)
    path = str(write_jsonl(tmp_path / "hs.jsonl", rows))
    sliced = HellaSwag(path, tok, split="validation[5:9]")  # a file has one split: its slice
    assert [context_of(tok, sliced[i]) for i in range(4)] == ["<s>" + r["ctx"] for r in rows[5:9]]
    limited = HellaSwag(path, tok, split="train[:50%]", num_samples_limit=3)
    assert len(limited) == 3
    assert context_of(tok, limited[2]) == "<s>" + rows[2]["ctx"]


def test_a_cached_hub_repo_reads_its_validation_split(tmp_path, tok, offline_hub, monkeypatch):
    hub = tmp_path / "hub"
    splits = {"train": hellaswag_rows(8), "validation": hellaswag_rows(6, seed=3, split="val")}
    write_hub_dataset(hub, "Rowan/hellaswag", splits, config="default")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    ds = HellaSwag("Rowan/hellaswag", tok, split="validation", num_samples_limit=4)
    assert len(ds) == 4
    assert targets_of(tok, ds[0]) == " " + _gold(splits["validation"][0]) + "</s>"


def test_the_unlabeled_test_split_is_a_data_error_naming_the_row(tmp_path, tok):
    rows = hellaswag_rows(4)
    rows[2]["label"] = ""
    with pytest.raises(TrainerError, match=r"row 3: field 'label'.*test split") as err:
        HellaSwag(str(write_parquet(tmp_path / "test.parquet", rows)), tok)
    assert "test.parquet" in err.value.message


def test_a_missing_file_is_a_data_error(tmp_path, tok):
    with pytest.raises(TrainerError, match="does not exist"):
        HellaSwag(str(tmp_path / "nope.parquet"), tok)
