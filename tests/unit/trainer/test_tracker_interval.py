"""`step_scheduler.log_remote_every_steps`: trackers get the train records of the first step
and every N-th after it (AutoModel's 0-based steps 0, N, 2N), every validation record, and
metrics.jsonl keeps every step (trainer.trackers.GuardedTracker)."""

from __future__ import annotations

from typing import Any

from trainer.trackers import GuardedTracker


class _Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.train: list[int] = []
        self.val: list[int] = []

    def log_train(self, record: dict[str, Any]) -> None:
        self.train.append(record["step"])

    def log_val(self, record: dict[str, Any]) -> None:
        self.val.append(record["step"])

    def finish(self, status: str) -> None:
        pass


def _feed(every: int) -> _Recorder:
    recorder = _Recorder()
    tracker = GuardedTracker(recorder, lambda name, message: None, every)
    for step in range(1, 11):
        tracker.log_train({"step": step})
        if step % 5 == 0:
            tracker.log_val({"step": step})
    return recorder


def test_every_nth_step_reaches_the_tracker_from_the_first():
    recorder = _feed(4)
    assert recorder.train == [1, 5, 9]
    assert recorder.val == [5, 10]


def test_the_default_logs_every_step():
    assert _feed(1).train == list(range(1, 11))
