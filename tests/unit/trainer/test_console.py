"""The job log's readable lines: a run's start, its first steps then one line per interval,
every checkpoint and ending, and a stop by signal said in one line; only rank 0 prints."""

from __future__ import annotations

import io

from trainer.console import Console, event_line, train_line


def test_train_lines_show_the_fields_the_record_has() -> None:
    record = {"step": 7, "loss": 2.345678, "lr": 1e-3, "grad_norm": 0.5, "tps": 1234.4,
              "mem": 0.25, "mfu": None}  # fmt: skip
    line = train_line(record)
    assert (
        line == "step 7 · loss 2.3457 · lr 1.00e-03 · grad_norm 0.500 · tok/s 1234 · mem_GiB 0.25"
    )
    assert train_line({"step": 1, "loss": 1.0}) == "step 1 · loss 1.0000"


def test_events_people_read_get_a_line_and_the_rest_none() -> None:
    assert event_line("preempted", 15, {}).startswith("stopped at step 15 on request (SIGTERM")
    assert (
        event_line("finished", 80, {"metrics": {"loss": 1.5}})
        == "finished at step 80 · loss 1.5000"
    )
    assert event_line("checkpoint_saved", 40, {"path": "/r/step_40"}) == (
        "checkpoint saved at step 40: /r/step_40"
    )
    assert event_line("metric_warning", 3, {"message": "mfu unknown"}) == (
        "warning (metric_warning): mfu unknown"
    )
    assert event_line("validation", 10, {"val_loss": 1.0}) is None


def test_the_first_steps_then_one_line_per_interval_on_rank_0_only() -> None:
    clock = iter([0.0, 0.1, 0.2, 0.3, 5.0, 10.5, 11.0])
    out = io.StringIO()
    rank0 = Console(True, out, clock=lambda: next(clock))
    for step in range(1, 8):
        rank0.record({"kind": "train", "step": step, "loss": 1.0})
    rank0.record({"kind": "val", "step": 7, "val_loss": 0.9})
    rank0.event("preempted", 7, {})
    printed = out.getvalue().splitlines()
    # steps 1-3, then step 6 (10 s after step 3); step 7 came too soon after it
    assert [line.split(" · ")[0] for line in printed[:4]] == [
        "[tuneyard] step 1", "[tuneyard] step 2", "[tuneyard] step 3", "[tuneyard] step 6",
    ]  # fmt: skip
    assert printed[4] == "[tuneyard] step 7 · val_loss 0.9"
    assert printed[5].startswith("[tuneyard] stopped at step 7 on request") and len(printed) == 6
    other = io.StringIO()
    Console(False, other).event("finished", 1, {})
    assert other.getvalue() == ""
