"""Batches: padding, sequence packing and label shifting.

Labels leave here already shifted: `labels[t]` is the token at t+1 when that token is a
target of the same sample, else -100. Unpacked rows derive them from `position_ids` (a
position of 0 starts a sample); packed rows carry the labels their samples had before
packing, so a sample split across two rows keeps the target of its split point.

Packing (`PackedDataset`) concatenates consecutive samples into rows of `pack_size`
tokens, resets position ids at each sample start, and pads the tail as a sample of its
own with no loss. A sample longer than `pack_size` is truncated, or dropped with
`drop_long_samples`; with `split_across_pack` a sample that does not fit fills the row
and continues at the start of the next one (its labels exact across the split; its
continuation is a document of that row, positions from 0, and attends only to itself);
`max_packs` stops after that many rows. Packed batches carry `position_ids` and no
`attention_mask`: tuneyard's models and Hugging Face attention (sdpa, eager, flex,
flash-attention 2) derive a block-diagonal causal mask from the position ids, so no
token attends across samples. They also carry the THD fields (`trainer.data.thd`:
`seq_lens`, `seq_lens_padded`, `cu_seqlens`), which the step never hands to the model.
Limit: an attention implementation that ignores `position_ids` for masking would let
tokens attend to earlier samples of the same row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from trainer.data.thd import document_lengths, thd_fields

Sample = dict[str, list[int]]
IGNORE = -100


def _empty_row() -> Sample:
    return {"input_ids": [], "loss_mask": [], "position_ids": [], "labels": []}


def sample_labels(ids: list[int], mask: list[int]) -> list[int]:
    """One unpacked sample's shifted labels: the next token where it is a target."""
    return shifted_labels(ids, mask, list(range(len(ids))))  # one sample: no boundary


class PackedDataset(Dataset):
    """Greedy, order-preserving packing of `dataset` into rows of at most `pack_size` tokens."""

    def __init__(
        self,
        dataset: Dataset | Sequence[Sample],
        pack_size: int,
        *,
        split_across_pack: bool = False,
        max_packs: int | None = None,
        drop_long_samples: bool = False,
    ):
        self.pack_size = pack_size
        self.split_across_pack = split_across_pack
        self.dropped = 0  # samples longer than a pack, left out under drop_long_samples
        self.rows: list[Sample] = []
        self._row = _empty_row()
        for index in range(len(dataset)):
            if max_packs is not None and len(self.rows) >= max_packs:
                break
            sample = dataset[index]
            if drop_long_samples and len(sample["input_ids"]) > pack_size:
                self.dropped += 1
                continue
            self._add(list(sample["input_ids"]), list(sample["loss_mask"]))
        if self._row["input_ids"]:
            self.rows.append(self._row)
        del self._row
        if max_packs is not None:
            self.rows = self.rows[:max_packs]

    def _add(self, ids: list[int], mask: list[int]) -> None:
        labels = sample_labels(ids, mask)
        if not self.split_across_pack and len(ids) > self.pack_size:
            ids, mask, labels = (
                ids[: self.pack_size],
                mask[: self.pack_size],
                labels[: self.pack_size],
            )
            labels[-1] = IGNORE  # its target was cut off with the rest of the sample
        if not self.split_across_pack and self._used() + len(ids) > self.pack_size:
            self._close_row()
        start = 0
        while start < len(ids):
            if self._used() == self.pack_size:
                self._close_row()
            end = min(len(ids), start + self.pack_size - self._used())
            self._row["input_ids"] += ids[start:end]
            self._row["loss_mask"] += mask[start:end]
            self._row["labels"] += labels[start:end]
            self._row["position_ids"] += list(range(end - start))
            start = end

    def _used(self) -> int:
        return len(self._row["input_ids"])

    def _close_row(self) -> None:
        if self._row["input_ids"]:
            self.rows.append(self._row)
        self._row = _empty_row()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Sample:
        return self.rows[index]


def shifted_labels(ids: list[int], mask: list[int], positions: list[int]) -> list[int]:
    labels = [IGNORE] * len(ids)
    for t in range(len(ids) - 1):
        if mask[t + 1] and positions[t + 1] != 0:
            labels[t] = ids[t + 1]
    return labels


class Collator:
    """Pad a list of samples into tensors; `packed` rows keep position ids, drop the mask,
    and add the THD fields."""

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
            n, pad = len(s["input_ids"]), length - len(s["input_ids"])
            pos = list(s.get("position_ids") or range(n)) + list(range(pad))
            row_ids = s["input_ids"] + [self.pad_token_id] * pad
            if "labels" in s:
                labels.append(list(s["labels"]) + [IGNORE] * pad)
            else:
                labels.append(shifted_labels(row_ids, s["loss_mask"] + [0] * pad, pos))
            ids.append(row_ids)
            positions.append(pos)
            attention.append([1] * n + [0] * pad)
        batch: dict[str, Any] = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "num_tokens": sum(len(s["input_ids"]) for s in samples),
        }
        if self.packed:
            batch["position_ids"] = torch.tensor(positions, dtype=torch.long)
            documents = [
                document_lengths(p[: len(s["input_ids"])])
                for p, s in zip(positions, samples, strict=True)
            ]
            batch.update(thd_fields(documents, length))
        else:
            batch["attention_mask"] = torch.tensor(attention, dtype=torch.long)
        return batch
