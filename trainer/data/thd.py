"""THD fields of a packed batch: each row's document lengths and cumulative offsets.

A packed row holds several documents back to back; position ids restart at 0 where a
document starts. Kernels that take the total-tokens (THD) layout want the boundaries as
lengths instead: `seq_lens` (real tokens per document), `seq_lens_padded` (the same, with
the row's tail padding counted in its last document, so a row's lengths sum to its
collated length) and `cu_seqlens` (0, then the running sum of `seq_lens_padded`). Rows
hold different numbers of documents, so each of the three is right-padded with
`SEQ_LENS_PAD` to the batch's longest, the sentinel AutoModel's THD collater uses.
tuneyard's own models read the position ids and ignore these fields.
"""

from __future__ import annotations

from itertools import accumulate

import torch

SEQ_LENS_PAD = -1000


def document_lengths(positions: list[int]) -> list[int]:
    """Lengths of the documents of one row's real tokens; a position of 0 starts one."""
    lengths: list[int] = []
    for position in positions:
        if position == 0 or not lengths:
            lengths.append(1)
        else:
            lengths[-1] += 1
    return lengths


def _padded_tensor(rows: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [SEQ_LENS_PAD] * (width - len(row)) for row in rows], dtype=dtype)


def thd_fields(documents: list[list[int]], length: int) -> dict[str, torch.Tensor]:
    """`seq_lens`, `seq_lens_padded` and `cu_seqlens` for rows collated to `length` tokens.

    `documents` holds each row's document lengths over its real tokens.
    """
    documents = [row or [0] for row in documents]  # an empty row: one empty document
    padded = [row[:-1] + [row[-1] + length - sum(row)] for row in documents]
    offsets = [[0, *accumulate(row)] for row in padded]
    return {
        "seq_lens": _padded_tensor(documents, torch.long),
        "seq_lens_padded": _padded_tensor(padded, torch.long),
        "cu_seqlens": _padded_tensor(offsets, torch.int32),
    }
