"""Batches: padding, sequence packing and label shifting.

Labels leave here already shifted: `labels[t]` is the token at t+1 when that token is a
target of the same sample, else -100. Sample boundaries are read from `position_ids`
(a position of 0 starts a sample), so the rule is the same for padded and packed rows.

Packing (`PackedDataset`) concatenates consecutive samples into rows of `pack_size`
tokens, resets position ids at each sample start, and pads the tail as a sample of its
own with no loss. Packed batches carry `position_ids` and no `attention_mask`: Hugging
Face attention (sdpa, eager, flex, flash-attention 2) then derives a block-diagonal
causal mask from the position ids, so no token attends across samples. Limits: an
attention implementation that ignores `position_ids` for masking (some native or custom
kernels) would let tokens attend to earlier samples of the same row; and a sample longer
than `pack_size` is truncated, never split across rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

Sample = dict[str, list[int]]


class PackedDataset(Dataset):
    """Greedy, order-preserving packing of `dataset` into rows of at most `pack_size` tokens."""

    def __init__(self, dataset: Dataset, pack_size: int):
        self.pack_size = pack_size
        self.rows: list[Sample] = []
        row: Sample = {"input_ids": [], "loss_mask": [], "position_ids": []}
        for index in range(len(dataset)):
            sample = dataset[index]
            ids, mask = sample["input_ids"][:pack_size], sample["loss_mask"][:pack_size]
            if row["input_ids"] and len(row["input_ids"]) + len(ids) > pack_size:
                self.rows.append(row)
                row = {"input_ids": [], "loss_mask": [], "position_ids": []}
            row["input_ids"] += ids
            row["loss_mask"] += mask
            row["position_ids"] += list(range(len(ids)))
        if row["input_ids"]:
            self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Sample:
        return self.rows[index]


def shifted_labels(ids: list[int], mask: list[int], positions: list[int]) -> list[int]:
    labels = [-100] * len(ids)
    for t in range(len(ids) - 1):
        if mask[t + 1] and positions[t + 1] != 0:
            labels[t] = ids[t + 1]
    return labels


class Collator:
    """Pad a list of samples into tensors; `packed` rows keep position ids, drop the mask."""

    def __init__(
        self,
        pad_token_id: int,
        packed: bool = False,
        pad_to: int | None = None,
        pad_to_multiple_of: int = 1,
    ):
        self.pad_token_id = pad_token_id
        self.packed = packed
        self.pad_to = pad_to
        self.multiple = max(1, pad_to_multiple_of)

    def _length(self, samples: list[Sample]) -> int:
        longest = max(len(s["input_ids"]) for s in samples)
        length = self.pad_to if self.pad_to is not None else longest
        return -(-max(length, longest) // self.multiple) * self.multiple

    def __call__(self, samples: list[Sample]) -> dict[str, Any]:
        length = self._length(samples)
        ids, labels, positions, attention = [], [], [], []
        for s in samples:
            n = len(s["input_ids"])
            pos = list(s.get("position_ids") or range(n)) + list(range(length - n))
            row_ids = s["input_ids"] + [self.pad_token_id] * (length - n)
            mask = s["loss_mask"] + [0] * (length - n)
            ids.append(row_ids)
            labels.append(shifted_labels(row_ids, mask, pos))
            positions.append(pos)
            attention.append([1] * n + [0] * (length - n))
        batch: dict[str, Any] = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "num_tokens": sum(len(s["input_ids"]) for s in samples),
        }
        if self.packed:
            batch["position_ids"] = torch.tensor(positions, dtype=torch.long)
        else:
            batch["attention_mask"] = torch.tensor(attention, dtype=torch.long)
        return batch
