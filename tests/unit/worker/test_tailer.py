"""The tailer: whole JSON lines from a byte offset, missing and replaced files, the offset store."""

from __future__ import annotations

from pathlib import Path

from worker.tailer import OffsetStore, read_new_lines


def test_tailer_returns_whole_lines_and_resumes_from_offset(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3')  # the last line is half-written
    first = read_new_lines(path, 0)
    assert [r["step"] for r in first.records] == [1, 2]
    assert first.end_offset == len('{"step": 1}\n{"step": 2}\n')
    assert [off for off, _ in first.entries] == [0, len('{"step": 1}\n')]
    with path.open("a") as f:
        f.write("}\nnot json\n[1]\n")
    second = read_new_lines(path, first.end_offset)
    assert [r["step"] for r in second.records] == [3]
    assert second.bad_lines == ["not json", "[1]"]
    assert second.end_offset == path.stat().st_size
    assert read_new_lines(path, second.end_offset).records == []


def test_tailer_handles_missing_and_replaced_files(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    assert read_new_lines(path, 0).end_offset == 0
    path.write_text('{"event": "started"}\n')
    again = read_new_lines(path, 10_000)  # offset past the end: the file was replaced
    assert again.records == [{"event": "started"}]


def test_offset_store_persists(tmp_path: Path):
    store = OffsetStore(tmp_path / "offsets.json")
    store.set("metrics", 42)
    assert OffsetStore(tmp_path / "offsets.json").get("metrics") == 42
    assert OffsetStore(tmp_path / "offsets.json").get("events") == 0
    (tmp_path / "broken.json").write_text("{")
    assert OffsetStore(tmp_path / "broken.json").get("metrics") == 0
