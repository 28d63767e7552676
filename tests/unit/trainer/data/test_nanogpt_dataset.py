"""NanogptDataset over real nanoGPT shards (both header formats) written by the test."""

from __future__ import annotations

import numpy as np
import pytest
from token_corpora import write_nanogpt_shard

from trainer.data.nanogpt import NanogptDataset
from trainer.errors import TrainerError

SEQ = 8


def test_windows_are_consecutive_seq_plus_one_slices_in_file_order(tmp_path):
    write_nanogpt_shard(tmp_path / "train_000.bin", np.arange(100))
    write_nanogpt_shard(tmp_path / "train_001.bin", np.arange(1000, 1050), width=4)
    ds = NanogptDataset(str(tmp_path / "train_*.bin"), seq_length=SEQ)
    assert len(ds) == 100 // 9 + 50 // 9
    assert ds[0]["input_ids"] == list(range(9)) and ds[0]["loss_mask"] == [1] * 9
    assert ds[10]["input_ids"] == list(range(90, 99))  # the last whole window of shard 0
    assert ds[11]["input_ids"] == list(range(1000, 1009))
    assert ds.shard_of(11).name == "train_001.bin"


def test_legacy_header_and_an_explicit_list(tmp_path):
    a = write_nanogpt_shard(tmp_path / "a.bin", np.arange(30), legacy=True)
    b = write_nanogpt_shard(tmp_path / "b.bin", np.arange(500, 520))
    ds = NanogptDataset([str(b), str(a)], seq_length=SEQ)
    assert [ds[i]["input_ids"][0] for i in range(len(ds))] == [500, 509, 0, 9, 18]


def test_align_to_bos_starts_every_window_on_bos(tmp_path):
    bos = 50
    tokens = [7, 7, bos, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, bos, 1, 2, bos, 1, 2, 3, 4, 5, 6, 7, 8]
    write_nanogpt_shard(tmp_path / "s.bin", tokens)
    ds = NanogptDataset(str(tmp_path / "s.bin"), seq_length=SEQ, bos_token=bos, align_to_bos=True)
    # the first BOS (2); the next BOS at or after 2+9=11 is at 14; then 14+9=23: none left
    assert [ds[i]["input_ids"][0] for i in range(len(ds))] == [bos, bos]
    assert ds[0]["input_ids"] == tokens[2:11] and ds[1]["input_ids"] == tokens[14:23]
    np.asarray([2, 14, 17], dtype=np.int32).tofile(tmp_path / "s.bos.idx")
    indexed = NanogptDataset(str(tmp_path / "s.bin"), SEQ, bos_token=bos, align_to_bos=True)
    assert [indexed[i] for i in range(len(indexed))] == [ds[i] for i in range(len(ds))]


def test_align_to_bos_needs_a_bos_token(tmp_path):
    write_nanogpt_shard(tmp_path / "s.bin", np.arange(40))
    with pytest.raises(TrainerError, match="bos_token"):
        NanogptDataset(str(tmp_path / "s.bin"), SEQ, align_to_bos=True)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[:500], "shorter than the 1024-byte shard header"),
        (lambda raw: b"\x01\x02\x03\x04" + raw[4:], "magic number"),
        (lambda raw: raw[:4] + b"\x02\x00\x00\x00" + raw[8:], "version 2"),
        (lambda raw: raw[:12] + b"\x03\x00\x00\x00" + raw[16:], "header.3. = 3"),
        (lambda raw: raw[:-10], "truncated"),
    ],
)
def test_corrupted_shards_are_data_errors(tmp_path, damage, message):
    path = write_nanogpt_shard(tmp_path / "s.bin", np.arange(40))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(TrainerError, match=message) as caught:
        NanogptDataset(str(path), SEQ)
    assert caught.value.exit_code.name == "DATA_ERROR"


def test_no_match_and_too_little_data(tmp_path):
    with pytest.raises(TrainerError, match="matches no file"):
        NanogptDataset(str(tmp_path / "none_*.bin"), SEQ)
    write_nanogpt_shard(tmp_path / "s.bin", np.arange(5))
    with pytest.raises(TrainerError, match="no window of 9 tokens"):
        NanogptDataset(str(tmp_path / "s.bin"), SEQ)
