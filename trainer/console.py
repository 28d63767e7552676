"""The run's human-readable lines on rank 0's stdout, which the worker keeps as the job log.

`metrics.jsonl` and `events.jsonl` are for machines; a person reading `tuneyard logs` or
the dashboard's log panel wants to see the run start, make progress, save checkpoints and
end. A train record is printed for the first steps and then at most every
`TRAIN_LINE_SECONDS` (a run logging every step would otherwise fill the log table with
lines the charts already show); every validation, checkpoint and ending is printed. A
stop asked by a signal (a pause, a cancel, a preemption) ends with one line that says so.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

TRAIN_LINE_SECONDS = 10.0
FIRST_STEPS = 3
TRAIN_FIELDS = (("loss", "loss", ".4f"), ("lr", "lr", ".2e"), ("grad_norm", "grad_norm", ".3f"),
                ("tps", "tok/s", ".0f"), ("mem", "mem_GiB", ".2f"))  # fmt: skip
WARNING_EVENTS = ("metric_warning", "tracker_warning", "kernel_fallback")


def train_line(record: dict[str, Any]) -> str:
    """`step 12 · loss 2.3456 · lr 1.00e-03 · ...` with the fields the record has."""
    parts = [f"step {record.get('step')}"]
    for key, name, spec in TRAIN_FIELDS:
        value = record.get(key)
        if isinstance(value, int | float):
            parts.append(f"{name} {value:{spec}}")
    return " · ".join(parts)


def event_line(name: str, step: int, fields: dict[str, Any]) -> str | None:
    """The line an event deserves, or None for events only machines read."""
    if name == "started":
        return f"training started at step {step}"
    if name == "checkpoint_saved":
        return f"checkpoint saved at step {step}: {fields.get('path', '')}"
    if name == "finished":
        loss = (fields.get("metrics") or {}).get("loss")
        return f"finished at step {step}" + (
            f" · loss {loss:.4f}" if isinstance(loss, float) else ""
        )
    if name == "resumed":
        return f"resumed at step {step} from {fields.get('path', '')}"
    if name == "preempted":
        return (
            f"stopped at step {step} on request (SIGTERM: a pause, a cancel or a preemption); "
            "a resume continues from the latest checkpoint"
        )
    if name in WARNING_EVENTS:
        return f"warning ({name}): {fields.get('message', '')}".rstrip(": ")
    return None


class Console:
    """Prints a run's lines on rank 0; a no-op elsewhere."""

    def __init__(
        self,
        enabled: bool,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.stream = stream
        self.clock = clock
        self._last_train = float("-inf")

    def say(self, line: str) -> None:
        if self.enabled:
            print(f"[tuneyard] {line}", file=self.stream or sys.stdout, flush=True)

    def record(self, data: dict[str, Any]) -> None:
        if data.get("kind") == "val":
            self.say(f"step {data.get('step')} · val_loss {data.get('val_loss')}")
            return
        now = self.clock()
        step = data.get("step")
        first = isinstance(step, int) and step <= FIRST_STEPS
        if first or now - self._last_train >= TRAIN_LINE_SECONDS:
            self._last_train = now
            self.say(train_line(data))

    def event(self, name: str, step: int, fields: dict[str, Any]) -> None:
        line = event_line(name, step, fields)
        if line is not None:
            self.say(line)
