"""Which dataset rows made each step: `D/samples.jsonl`, written by rank 0.

The sampler is deterministic (`trainer.data.sampler`): a micro-batch is named by its data
position `(epoch, batch number)`, and rank 0 turns the positions a step drew into every
data-parallel rank's dataset indices without any communication. Each step adds one line
`{"kind": "step", "step", "epoch", "attempt"?, "rows": [{"index", "dp_rank", "micro_batch",
"id"?}]}` (a few ints per sample; `attempt` is the worker's attempt number when it launched
the run); the first time a row index appears, one line
`{"kind": "row", "index", "id"?, "tokens", "preview"}` carries its decoded text, capped, so
the file grows with the dataset, not with the steps. A step re-run after a resume or a
rollback writes its line again; the worker keeps the last one (`jobs.store.samples`).
Positions in `run.skipped_batches` (rows a rollback skipped) are not drawn at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.metrics import JsonlWriter

SAMPLES_FILE = "samples.jsonl"
ATTEMPT_ENV = "TUNEYARD_ATTEMPT"  # set by the worker's launcher
PREVIEW_TOKENS = 96
PREVIEW_CHARS = 240

Position = tuple[int, int]  # (epoch, batch number within the epoch) of one micro-batch


class StepRows:
    """Tracks the positions a step draws and writes them as dataset rows (rank 0)."""

    def __init__(self, run_dir: Path, is_rank0: bool):
        self.is_rank0 = is_rank0
        self.writer = JsonlWriter(run_dir / SAMPLES_FILE, is_rank0)
        self.drawn: list[Position] = []
        self._order: tuple[int, list[int]] | None = None  # (epoch, order), the last epoch
        self._previewed: set[int] = set()
        attempt = os.environ.get(ATTEMPT_ENV, "")
        self.attempt = int(attempt) if attempt.isdigit() else None

    def tracked(self, stream: Iterator[tuple[int, Any]], run: Any) -> Iterator[tuple[int, Any]]:
        """`stream` ((epoch, batch) from the data position) without skipped positions;
        remembers the position of each micro-batch it hands out."""
        for epoch, batch in stream:
            position = (run.data_state["epoch"], run.data_state["batches_done"] - 1)
            if position in run.skipped_batches:
                continue
            self.drawn.append(position)
            yield epoch, batch

    def take(self) -> list[Position]:
        """The positions drawn since the last call: the step's micro-batches."""
        drawn, self.drawn = self.drawn, []
        return drawn

    def _epoch_order(self, sampler: Any, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, sampler.epoch_order(epoch))
        return self._order[1]

    def rows(self, run: Any, positions: list[Position]) -> list[dict[str, Any]]:
        """Every data-parallel rank's dataset rows for these micro-batch positions."""
        sampler = run.train_loader.batch_sampler
        size, dp = sampler.batch_size, sampler.dp_size
        row_ids = getattr(run.train_loader.dataset, "row_ids", None)
        rows = []
        for micro, (epoch, number) in enumerate(positions):
            order = self._epoch_order(sampler, epoch)
            for dp_rank in range(dp):
                # order[dp_rank::dp][number * size : (number + 1) * size], without the copy
                first, stop = dp_rank + number * size * dp, dp_rank + (number + 1) * size * dp
                for index in order[first:stop:dp]:
                    row = {"index": index, "dp_rank": dp_rank, "micro_batch": micro}
                    if row_ids is not None:
                        row["id"] = row_ids[index]
                    rows.append(row)
        return rows

    def write_step(self, run: Any, step: int, positions: list[Position]) -> None:
        if not self.is_rank0 or not positions:
            return
        rows = self.rows(run, positions)
        for row in rows:
            if row["index"] not in self._previewed:
                self._previewed.add(row["index"])
                self.writer.write(preview_line(run, row))
        epoch = positions[0][0]
        line = {"kind": "step", "step": step, "epoch": epoch, "rows": rows}
        if self.attempt is not None:  # which attempt ran it, whichever worker ingests it
            line["attempt"] = self.attempt
        self.writer.write(line)

    def close(self) -> None:
        self.writer.close()


def preview_line(run: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The `row` line of one dataset index: its token count and decoded text, capped."""
    line: dict[str, Any] = {"kind": "row", "index": row["index"]}
    if "id" in row:
        line["id"] = row["id"]
    try:
        ids = list(run.train_loader.dataset[row["index"]]["input_ids"])
    except (KeyError, IndexError, TypeError):
        return {**line, "tokens": None, "preview": None}
    head = [int(i) for i in ids[:PREVIEW_TOKENS]]
    tokenizer = run.tokenizer
    text = tokenizer.decode(head) if tokenizer is not None else " ".join(map(str, head))
    if len(ids) > PREVIEW_TOKENS:
        text += " …"
    return {**line, "tokens": len(ids), "preview": text[:PREVIEW_CHARS]}


def describe(rows: list[dict[str, Any]], limit: int = 16) -> str:
    """`index 5 (id abc), index 17, ...` for a message naming rows."""
    parts = [
        f"{r['index']}" + (f" (id {r['id']})" if r.get("id") is not None else "") for r in rows
    ]
    more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
    return "dataset rows " + ", ".join(parts[:limit]) + more
