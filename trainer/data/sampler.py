"""A resumable, distributed batch sampler: the data position is a checkpointable pair.

Every data-parallel rank draws the same seeded permutation for an epoch (seed + epoch),
keeps every `dp_size`-th index starting at its rank, and groups them into batches. The
epoch is cut to a multiple of `dp_size * batch_size` so all ranks run the same number of
forward passes (FSDP and DDP need that). The position `(epoch, batches_done)` goes into
`trainer_state.json`; restoring it replays exactly the batches the interrupted run had
not yet consumed. Tensor-parallel peers share a dp rank and so see the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ):
        self.num_samples, self.batch_size = num_samples, batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.batches_done = 0

    def epoch_order(self, epoch: int) -> list[int]:
        """Every rank's indices of `epoch`, interleaved (rank r takes every dp_size-th from r)."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        per_step = self.dp_size * (self.batch_size if self.drop_last else 1)
        return order[: len(order) // per_step * per_step]

    def _rank_indices(self) -> list[int]:
        return self.epoch_order(self.epoch)[self.dp_rank :: self.dp_size]

    def __len__(self) -> int:
        per_rank = len(self._rank_indices())
        if self.drop_last:
            return per_rank // self.batch_size
        return -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        indices = self._rank_indices()
        for start in range(self.batches_done * self.batch_size, len(indices), self.batch_size):
            batch = indices[start : start + self.batch_size]
            if len(batch) == self.batch_size or not self.drop_last:
                yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_done": self.batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])
