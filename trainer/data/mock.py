"""`MockIterableDataset`: random tokens for benchmarks, reproducible per sample index.

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
