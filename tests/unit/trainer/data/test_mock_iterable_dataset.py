"""MockIterableDataset and MockSentenceDataset: reproducible per index, AutoModel's sizes and label
layout."""

from __future__ import annotations

import pytest

from trainer.data.collate import Collator
from trainer.data.mock import MockIterableDataset


def test_each_index_is_reproducible_and_distinct():
    a, b = MockIterableDataset(vocab_size=50, seq_length=12, num_samples=6, seed=3), None
    b = MockIterableDataset(vocab_size=50, seq_length=12, num_samples=6, seed=3)
    assert [a[i] for i in range(6)] == [b[i] for i in reversed(range(6))][::-1]
    assert len({tuple(a[i]["input_ids"]) for i in range(6)}) == 6
    other = MockIterableDataset(vocab_size=50, seq_length=12, num_samples=6, seed=4)
    assert other[0] != a[0]
    assert all(0 <= t < 50 for i in range(6) for t in a[i]["input_ids"])


def test_batch_size_multiplies_the_samples_and_labels_match_automodels():
    ds = MockIterableDataset(vocab_size=30, seq_length=10, num_samples=4, batch_size=3)
    assert len(ds) == 12
    sample = ds[11]
    labels = Collator(0)([sample])["labels"][0].tolist()
    assert labels == sample["input_ids"][1:] + [-100]  # AutoModel: shifted, last -100
    with pytest.raises(IndexError):
        ds[12]


def test_excluded_token_ids_never_appear():
    from trainer.data.mock import MockIterableDataset

    dataset = MockIterableDataset(
        vocab_size=8, seq_length=256, num_samples=4, exclude_token_ids=[0, 3]
    )
    tokens = {t for i in range(len(dataset)) for t in dataset[i]["input_ids"]}
    assert tokens == {1, 2, 4, 5, 6, 7}
    with pytest.raises(ValueError, match="no token id"):
        MockIterableDataset(vocab_size=2, exclude_token_ids=[0, 1])


def test_mock_sentences_are_variable_length_reproducible_and_end_with_eos():
    from trainer.data.mock import MockSentenceDataset

    ds = MockSentenceDataset(num_sentences=40, mean_len=8, std_len=3, vocab_size=10,
                             max_sentence_len=12, seed=3)  # fmt: skip
    rows = [ds[i]["input_ids"] for i in range(len(ds))]
    assert len(ds) == 40 and len({len(r) for r in rows}) > 3
    assert all(2 <= len(r) <= 13 and r[-1] == 1 for r in rows)
    assert all(2 <= t < 10 for r in rows for t in r[:-1])
    assert all(ds[i]["loss_mask"] == [1] * len(rows[i]) for i in range(len(ds)))
    again = MockSentenceDataset(num_sentences=40, mean_len=8, std_len=3, vocab_size=10,
                                max_sentence_len=12, seed=3)  # fmt: skip
    assert [again[i]["input_ids"] for i in (39, 0)] == [rows[39], rows[0]]
    fixed = MockSentenceDataset(num_sentences=2, mean_len=6, std_len=0)
    assert [len(fixed[i]["input_ids"]) for i in range(2)] == [7, 7]
