"""Reading the ranks' failure records back: what the trainer writes is read; garbage, links,
special files, oversized files, mismatched names and other attempts' records are skipped;
clearing never follows a link; an appended event is a line of its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jobs.recipe.exit_codes import FAILURES_DIR, RECORD_BYTES_MAX, RankFailure
from trainer.failure_record import write_failure_record
from worker.rank_failures import append_event, clear_failure_records, read_failure_records
from worker.tailer import read_new_lines


def record(rank: int, attempt: int | None = 1, **fields) -> RankFailure:
    base = {"exit_code": 3, "message": f"bad row on {rank}", "timestamp": 1.0e9 + rank}
    return RankFailure(rank=rank, world_size=4, attempt=attempt, **{**base, **fields})


def test_records_written_by_the_ranks_are_read_in_rank_order(tmp_path: Path):
    for rank in (2, 0, 1):
        write_failure_record(tmp_path, record(rank))
    assert read_failure_records(tmp_path, 1) == [record(0), record(1), record(2)]


def test_no_folder_or_a_link_in_its_place_reads_as_no_records(tmp_path: Path):
    assert read_failure_records(tmp_path, 1) == []
    elsewhere = tmp_path / "elsewhere"
    write_failure_record(elsewhere, record(0))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / FAILURES_DIR).symlink_to(elsewhere / FAILURES_DIR)
    assert read_failure_records(run_dir, 1) == []
    (run_dir / FAILURES_DIR).unlink()
    (run_dir / FAILURES_DIR).write_text("not a folder")
    assert read_failure_records(run_dir, 1) == []


def test_garbage_partial_hostile_and_stale_files_are_skipped(tmp_path: Path):
    write_failure_record(tmp_path, record(1))
    folder = tmp_path / FAILURES_DIR
    (folder / "rank-0.json").write_text('{"rank": 0, "exit_code": 3, "mess')  # cut short
    (folder / "rank-2.json").write_bytes(b"\xff\xfe not utf-8")
    (folder / "rank-3.json").write_text("[" * 5000 + "]" * 5000)  # nested past reason
    (folder / "rank-4.json").write_text(json.dumps(record(5).to_json()))  # names another rank
    big = {**record(6).to_json(), "message": "x" * RECORD_BYTES_MAX}
    (folder / "rank-6.json").write_text(json.dumps(big))
    (folder / "rank-7.json").write_text(json.dumps(record(7, attempt=0).to_json()))  # stale
    (folder / "rank-8.json").symlink_to(folder / "rank-1.json")
    os.mkfifo(folder / "rank-9.json")  # would block a plain read forever
    (folder / "rank-10.json").mkdir()
    (folder / "notes.txt").write_text(json.dumps(record(11).to_json()))
    (folder / ".rank-12.json.99.tmp").write_text(json.dumps(record(12).to_json()))
    assert read_failure_records(tmp_path, 1) == [record(1)]


def test_clearing_removes_records_and_never_follows_a_link(tmp_path: Path):
    write_failure_record(tmp_path, record(0))
    clear_failure_records(tmp_path)
    assert not (tmp_path / FAILURES_DIR).exists()
    clear_failure_records(tmp_path)  # nothing to clear
    keep = tmp_path / "keep"
    write_failure_record(keep, record(0))
    (tmp_path / FAILURES_DIR).symlink_to(keep / FAILURES_DIR)
    clear_failure_records(tmp_path)
    assert not (tmp_path / FAILURES_DIR).exists() and (keep / FAILURES_DIR / "rank-0.json").exists()
    (tmp_path / FAILURES_DIR).mkdir()
    (tmp_path / FAILURES_DIR / "inner").symlink_to(keep / FAILURES_DIR)
    clear_failure_records(tmp_path)
    assert not (tmp_path / FAILURES_DIR).exists() and (keep / FAILURES_DIR / "rank-0.json").exists()


def test_an_appended_event_is_a_line_of_its_own_after_a_half_written_one(tmp_path: Path):
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "started", "step": 0}\n{"event": "valid')  # rank 0 was killed
    assert append_event(events, {"event": "failed", "step": 2, "code": "data_error"})
    batch = read_new_lines(events, 0)
    assert [r["event"] for r in batch.records] == ["started", "failed"]
    assert batch.bad_lines == ['{"event": "valid']
    fresh = tmp_path / "fresh" / "events.jsonl"
    fresh.parent.mkdir()
    assert append_event(fresh, {"event": "failed"}) and fresh.read_text() == '{"event": "failed"}\n'


def test_an_event_is_never_appended_through_a_link(tmp_path: Path):
    target = tmp_path / "other-job-events.jsonl"
    target.write_text("")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").symlink_to(target)
    assert not append_event(tmp_path / "run" / "events.jsonl", {"event": "failed"})
    assert target.read_text() == ""
