"""`MockIterableDataset` and `MockSentenceDataset`: random tokens, reproducible per sample index.

AutoModel's mock benchmark dataset is an iterable that draws every sequence from one
seeded stream. Here sample `i` is drawn from a generator keyed by `(seed, i)`, which makes
the dataset map-style and therefore resumable: tuneyard's sampler owns the order and the
position, so a resumed job reads exactly the samples the interrupted one had not, with no
stream to replay. Each sample is `seq_length` tokens with loss on every one; the collator
turns that into `seq_length - 1` next-token labels, the last position unlabeled, as
AutoModel's mock labels are. `batch_size` sequences per AutoModel "sample" become
`batch_size` samples here, so the dataset holds `num_samples * batch_size` of them; the
dataloader's batch size then groups them. `exclude_token_ids` (pad, BOS, ...) never appear.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset


class MockIterableDataset(Dataset):
    def __init__(
        self,
        vocab_size: int = 1024,
        seq_length: int = 1024,
        num_samples: int = 1_000_000,
        batch_size: int = 1,
        seed: int = 0,
        exclude_token_ids: list[int] | None = None,
    ):
        self.vocab_size, self.seq_length = vocab_size, seq_length
        self.length, self.seed = num_samples * batch_size, seed
        # the ids a sample may hold: every id below vocab_size but the excluded (pad, BOS, ...)
        excluded = set(exclude_token_ids or ())
        self.allowed = np.array([t for t in range(vocab_size) if t not in excluded], np.int64)
        if self.allowed.size == 0:
            raise ValueError("exclude_token_ids leaves no token id below vocab_size")

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        if not 0 <= index < self.length:
            raise IndexError(f"sample {index} of a {self.length}-sample mock dataset")
        generator = np.random.Generator(np.random.PCG64([self.seed & (2**63 - 1), index]))
        ids = self.allowed[generator.integers(0, self.allowed.size, self.seq_length)]
        return {"input_ids": ids.tolist(), "loss_mask": [1] * self.seq_length}


class MockSentenceDataset(Dataset):
    """AutoModel's `build_unpacked_dataset`: `num_sentences` rows of variable length, each
    `max(1, min(max_sentence_len, int(N(mean_len, std_len))))` ids drawn uniformly from
    2 .. vocab_size - 1, then the end-of-sentence id 1 (0 is AutoModel's pad id, never drawn);
    the loss on every token. Row `i` is drawn from a generator keyed by `(seed, i)`, as
    above, so a resumed job reads the same rows (AutoModel draws one seeded stream: the same
    distribution, not the same ids)."""

    EOS = 1

    def __init__(
        self,
        num_sentences: int = 10,
        mean_len: float = 20.0,
        std_len: float = 6.0,
        vocab_size: int = 100,
        max_sentence_len: int = 64,
        seed: int = 0,
    ):
        if vocab_size < 3:
            raise ValueError("vocab_size must be at least 3 (0 is pad, 1 end-of-sentence)")
        self.num_sentences, self.mean_len, self.std_len = num_sentences, mean_len, std_len
        self.vocab_size, self.max_len, self.seed = vocab_size, max_sentence_len, seed

    def __len__(self) -> int:
        return self.num_sentences

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        if not 0 <= index < self.num_sentences:
            raise IndexError(f"sentence {index} of a {self.num_sentences}-sentence mock dataset")
        generator = np.random.Generator(np.random.PCG64([self.seed & (2**63 - 1), index]))
        length = max(1, min(self.max_len, int(generator.normal(self.mean_len, self.std_len))))
        ids = generator.integers(2, self.vocab_size, length).tolist() + [self.EOS]
        return {"input_ids": ids, "loss_mask": [1] * len(ids)}
