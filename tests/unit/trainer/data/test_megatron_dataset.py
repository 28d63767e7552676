"""MegatronPretraining over real `.bin`/`.idx` files written by `tests/token_corpora.py`."""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pytest
from token_corpora import counting_documents, write_megatron

from trainer.data.collate import Collator
from trainer.data.megatron import MegatronPretraining, parse_split
from trainer.data.megatron_index import IndexedTokens
from trainer.errors import TrainerError

SEQ = 16


def _stream(prefix, docs):
    write_megatron(prefix, docs)
    return np.concatenate([np.asarray(d) for d in docs])


def test_the_index_layout_is_megatron_cores(tmp_path):
    """Read the header by the spec's offsets, not through our reader: 9-byte magic, <Q
    version, <B dtype code (8 = uint16), <Q sequences, <Q documents, int32 lengths, int64
    byte pointers, int64 document indices."""
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    prefix = write_megatron(tmp_path / "c", docs)
    raw = (tmp_path / "c.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<QBQQ", raw[9:34]) == (1, 8, 3, 4)
    assert struct.unpack("<3i", raw[34:46]) == (3, 2, 4)
    assert struct.unpack("<3q", raw[46:70]) == (0, 6, 10)  # bytes: uint16 tokens
    assert struct.unpack("<4q", raw[70:102]) == (0, 1, 2, 3)
    data = IndexedTokens(str(prefix))
    assert data.dtype == np.uint16 and list(data.lengths) == [3, 2, 4]
    assert data.read(2, 1, 2).tolist() == [7, 8]


def test_samples_are_seq_plus_one_tokens_of_the_shuffled_stream(tmp_path):
    docs = counting_documents(40, 10)
    _stream(tmp_path / "c", docs)
    ds = MegatronPretraining(paths=str(tmp_path / "c"), seq_length=SEQ, split="1,0,0")
    assert len(ds) == (400 - 1) // SEQ
    seen = []
    for i in range(len(ds)):
        sample = ds[i]
        assert len(sample["input_ids"]) == SEQ + 1 and sample["loss_mask"] == [1] * (SEQ + 1)
        seen.append(sample["input_ids"])
    # consecutive stream windows overlap by one token: the sample shuffle is a permutation
    firsts = Counter(tuple(s) for s in seen)
    assert len(firsts) == len(ds)
    labels = Collator(0)([ds[0]])["labels"][0].tolist()
    assert labels[:-1] == ds[0]["input_ids"][1:] and labels[-1] == -100


def test_samples_cross_document_boundaries_in_document_order(tmp_path):
    """Each document's tokens count up; a sample is whole documents' runs glued in order."""
    docs = counting_documents(30, 7, vocab=60000)
    write_megatron(tmp_path / "c", docs)
    ds = MegatronPretraining(paths=str(tmp_path / "c"), seq_length=SEQ, split="100")
    starts = {d[0] for d in docs}
    for i in range(len(ds)):
        ids = ds[i]["input_ids"]
        breaks = [t for t in range(1, len(ids)) if ids[t] != ids[t - 1] + 1]
        assert all(ids[t] in starts for t in breaks)  # a jump only onto a document's start
    tokens = sorted(t for i in range(len(ds)) for t in ds[i]["input_ids"])
    assert set(tokens) <= {t for d in docs for t in d}


def test_split_ranges_are_disjoint_sequence_ranges(tmp_path):
    docs = counting_documents(100, 20, vocab=60000)
    write_megatron(tmp_path / "c", docs)
    common = dict(paths=str(tmp_path / "c"), seq_length=SEQ, split="80,20,0")
    train = MegatronPretraining(**common)
    val = MegatronPretraining(**common, splits_to_build="validation")
    train_tokens = {t for i in range(len(train)) for t in train[i]["input_ids"]}
    val_tokens = {t for i in range(len(val)) for t in val[i]["input_ids"]}
    assert max(train_tokens) < 80 * 20 <= min(val_tokens)
    assert parse_split("99,1,0") == [(0.0, 0.99), (0.99, 1.0), None]
    with pytest.raises(TrainerError, match="test split none"):
        MegatronPretraining(**common, splits_to_build="test")


def test_blend_weights_are_honoured(tmp_path):
    write_megatron(tmp_path / "a", [[1] * 50 for _ in range(40)])
    write_megatron(tmp_path / "b", [[2] * 50 for _ in range(40)])
    ds = MegatronPretraining(
        paths=["70", str(tmp_path / "a"), 30, str(tmp_path / "b")],
        seq_length=SEQ,
        split="1,0,0",
        num_train_samples=200,
    )
    assert len(ds) == 200
    sources = [ds[i]["input_ids"][0] for i in range(200)]
    assert sources.count(1) == 140 and sources.count(2) == 60
    for n in (10, 37, 101):  # every prefix of the blend is within one sample of the weights
        assert abs(sources[:n].count(1) - 0.7 * n) <= 1


def test_split_mapping_gives_each_split_its_own_data(tmp_path):
    write_megatron(tmp_path / "t", [[3] * 40 for _ in range(10)])
    write_megatron(tmp_path / "v", [[4] * 40 for _ in range(10)])
    paths = {"train": str(tmp_path / "t"), "validation": [str(tmp_path / "v")],
             "test": str(tmp_path / "v")}  # fmt: skip
    val = MegatronPretraining(paths=paths, seq_length=SEQ, splits_to_build="validation")
    assert {val[i]["input_ids"][0] for i in range(len(val))} == {4}
    assert len(val) == (400 - 1) // SEQ


def test_glob_and_bin_file_forms_name_prefixes(tmp_path):
    write_megatron(tmp_path / "part_0_text_document", counting_documents(10, 30))
    write_megatron(tmp_path / "part_1_text_document", counting_documents(10, 30, start=300))
    globbed = MegatronPretraining(
        paths=str(tmp_path / "part_*_text_document*"), seq_length=SEQ, split="1"
    )
    assert sorted({globbed.source_of(i) for i in range(len(globbed))}) == [
        str(tmp_path / "part_0_text_document"),
        str(tmp_path / "part_1_text_document"),
    ]
    single = MegatronPretraining(
        paths=str(tmp_path / "part_0_text_document.bin"), seq_length=SEQ, split="1"
    )
    assert len(single) == (300 - 1) // SEQ


def test_same_keywords_same_samples_and_seed_changes_them(tmp_path):
    write_megatron(tmp_path / "c", counting_documents(50, 13))
    make = lambda seed: MegatronPretraining(  # noqa: E731
        paths=str(tmp_path / "c"), seq_length=SEQ, split="1", seed=seed
    )
    a, b, c = make(1), make(1), make(2)
    assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    assert [a[i] for i in range(len(a))] != [c[i] for i in range(len(c))]


def test_index_mapping_dir_saves_and_reloads_the_same_index(tmp_path):
    write_megatron(tmp_path / "c", counting_documents(50, 13))
    cache = tmp_path / "maps"
    common = dict(
        paths=str(tmp_path / "c"), seq_length=SEQ, split="1", index_mapping_dir=str(cache)
    )
    built = MegatronPretraining(**common)
    saved = sorted(p.name for p in cache.iterdir())
    assert len(saved) == 3 and all(name.endswith(".npy") for name in saved)
    loaded = MegatronPretraining(**common)
    assert isinstance(loaded.parts[0].shuffle, np.memmap)
    assert [built[i] for i in range(len(built))] == [loaded[i] for i in range(len(loaded))]


def test_more_samples_than_an_epoch_repeat_documents(tmp_path):
    write_megatron(tmp_path / "c", counting_documents(10, 20))
    ds = MegatronPretraining(paths=str(tmp_path / "c"), seq_length=SEQ, split="1",
                             num_train_samples=50)  # fmt: skip
    assert len(ds) == 50 and len(ds.parts[0].documents) == 5 * 10


@pytest.mark.parametrize("missing", [".bin", ".idx"])
def test_a_missing_file_names_it(tmp_path, missing):
    write_megatron(tmp_path / "c", counting_documents(10, 20))
    (tmp_path / f"c{missing}").unlink()
    with pytest.raises(TrainerError, match=rf"c\{missing} does not exist"):
        MegatronPretraining(paths=str(tmp_path / "c"), seq_length=SEQ)


def test_corrupted_files_are_data_errors(tmp_path):
    prefix = write_megatron(tmp_path / "c", counting_documents(10, 20))
    idx, bin_ = tmp_path / "c.idx", tmp_path / "c.bin"
    good_idx, good_bin = idx.read_bytes(), bin_.read_bytes()
    cases = [
        (b"NOTANIDX!" + good_idx[9:], good_bin, "MMIDIDX"),
        (good_idx[:9] + struct.pack("<Q", 2) + good_idx[17:], good_bin, "version 2"),
        (good_idx[:17] + b"\x07" + good_idx[18:], good_bin, "dtype code 7"),
        (good_idx[:60], good_bin, "truncated index"),
        (good_idx, good_bin[:-40], "truncated or not this index"),
        (good_idx, good_bin + b"\x00", "whole number"),
    ]
    for idx_bytes, bin_bytes, message in cases:
        idx.write_bytes(idx_bytes)
        bin_.write_bytes(bin_bytes)
        with pytest.raises(TrainerError, match=message) as caught:
            MegatronPretraining(paths=str(prefix), seq_length=SEQ)
        assert caught.value.exit_code.name == "DATA_ERROR"


def test_a_split_too_short_for_one_sample(tmp_path):
    write_megatron(tmp_path / "c", [[1, 2, 3]])
    with pytest.raises(TrainerError, match="not enough for one sample"):
        MegatronPretraining(paths=str(tmp_path / "c"), seq_length=SEQ, split="1")
