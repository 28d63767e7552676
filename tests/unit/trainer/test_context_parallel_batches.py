"""`trainer.context_parallel`: each cp rank's slice of a collated batch, and the model guard.

In-process (no process group: `shard_batch` reads only the topology's cp rank and size).
The ranks' slices together hold every token and label of the batch once, at the global
positions their position ids name; rows are right-padded to a multiple of 2*cp with
ignored labels; `num_tokens` and the label count sum over the ranks to the batch's own, so
the step loop's global normalisation is unchanged; packed rows keep their document-local
position ids; cp 1 returns the batch itself. A model with no native attention (the
Hugging Face class) is refused with a data error.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from trainer.context_parallel import apply_context_parallel, shard_batch
from trainer.data.collate import Collator
from trainer.errors import TrainerError


def _batch() -> dict:
    samples = [
        {"input_ids": list(range(1, 11)), "loss_mask": [0] * 3 + [1] * 7},
        {"input_ids": list(range(20, 27)), "loss_mask": [1] * 7},
    ]
    return Collator(pad_token_id=0)(samples)  # 10 and 7 tokens: rows of 10, right-padded


def _slices(batch: dict, size: int) -> list[dict]:
    return [shard_batch(batch, SimpleNamespace(cp_size=size, cp_rank=r)) for r in range(size)]


@pytest.mark.parametrize("size", [2, 3])
def test_the_slices_hold_every_token_once_at_its_global_position(size):
    batch = _batch()
    slices = _slices(batch, size)
    padded = -(-10 // (2 * size)) * 2 * size
    ids = torch.zeros(2, padded, dtype=torch.long)
    labels = torch.full((2, padded), -100)
    seen = torch.zeros(padded, dtype=torch.long)
    for part in slices:
        assert set(part) == {"input_ids", "labels", "position_ids", "num_tokens"}
        assert part["input_ids"].shape == (2, padded // size)
        positions = part["position_ids"][0]
        assert torch.equal(part["position_ids"][1], positions)
        ids[:, positions], labels[:, positions] = part["input_ids"], part["labels"]
        seen[positions] += 1
    assert seen.tolist() == [1] * padded
    assert torch.equal(ids[:, :10], batch["input_ids"]) and not ids[:, 10:].any()
    assert torch.equal(labels[:, :10], batch["labels"]) and (labels[:, 10:] == -100).all()


def test_token_and_label_counts_sum_to_the_batch():
    batch = _batch()
    slices = _slices(batch, 2)
    assert sum(p["num_tokens"] for p in slices) == batch["num_tokens"] == 17
    labels = sum(int((p["labels"] != -100).sum()) for p in slices)
    assert labels == int((batch["labels"] != -100).sum())
    # rank 0 keeps chunks 0 and 3 of 4: positions 0-2 and 9-11 of the padded 12
    assert slices[0]["position_ids"][0].tolist() == [0, 1, 2, 9, 10, 11]


def test_packed_rows_keep_their_document_positions():
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
    ids = torch.arange(16).view(2, 8)
    batch = {"input_ids": ids, "labels": ids, "position_ids": positions, "num_tokens": 16}
    slices = _slices(batch, 2)  # chunks of 2: rank 0 keeps 0-1 and 6-7, rank 1 keeps 2-5
    assert slices[0]["position_ids"].tolist() == [[0, 1, 1, 2], [0, 1, 6, 7]]
    assert slices[1]["position_ids"].tolist() == [[2, 3, 4, 0], [2, 3, 4, 5]]
    assert slices[1]["input_ids"].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert sum(p["num_tokens"] for p in slices) == 16


def test_cp_one_returns_the_batch_itself():
    batch = _batch()
    assert shard_batch(batch, SimpleNamespace(cp_size=1, cp_rank=0)) is batch


def test_a_model_without_native_attention_is_refused_as_data():
    topology = SimpleNamespace(cp_mesh=SimpleNamespace(get_group=lambda: None))
    with pytest.raises(TrainerError) as raised:
        apply_context_parallel(torch.nn.Linear(2, 2), topology)
    assert raised.value.exit_code == ExitCode.DATA_ERROR
    assert "cp_size: 1" in raised.value.message
