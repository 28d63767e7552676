"""`trainer.sample_log`: a step's dataset rows are the ones each rank's sampler drew."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.data.sampler import ResumableBatchSampler
from trainer.sample_log import StepRows, describe, preview_line


def _run(num_samples: int, batch_size: int, dp_size: int, dataset=None) -> SimpleNamespace:
    sampler = ResumableBatchSampler(num_samples, batch_size, dp_size=dp_size, seed=3)
    loader = SimpleNamespace(batch_sampler=sampler, dataset=dataset or [])
    return SimpleNamespace(train_loader=loader, tokenizer=None)


@pytest.mark.parametrize("dp_size", [1, 3])
def test_rows_are_each_ranks_sampler_batches(tmp_path: Path, dp_size: int) -> None:
    run, size = _run(num_samples=50, batch_size=4, dp_size=dp_size), 4
    rows = StepRows(tmp_path, is_rank0=True).rows(run, [(1, 0), (1, 2)])
    for dp_rank in range(dp_size):
        sampler = ResumableBatchSampler(50, size, dp_rank=dp_rank, dp_size=dp_size, seed=3)
        sampler.load_state_dict({"epoch": 1, "batches_done": 0})
        drawn = list(sampler)
        for micro, number in enumerate((0, 2)):
            mine = [
                r["index"] for r in rows if r["dp_rank"] == dp_rank and r["micro_batch"] == micro
            ]
            assert mine == drawn[number]


def test_a_row_the_dataset_cannot_give_has_no_preview() -> None:
    run = _run(num_samples=4, batch_size=1, dp_size=1, dataset=[])
    line = preview_line(run, {"index": 7, "id": "x"})
    assert line == {"kind": "row", "index": 7, "id": "x", "tokens": None, "preview": None}


def test_describe_names_at_most_the_limit() -> None:
    rows = [{"index": i, "id": "a" if i == 0 else None} for i in range(5)]
    assert describe(rows, limit=2) == "dataset rows 0 (id a), 1 and 3 more"
