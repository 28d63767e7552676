"""Reading new complete lines from an append-only JSONL file, by byte offset.

The trainer appends one JSON object per line to `metrics.jsonl` and `events.jsonl`. The
tailer returns only whole lines (a line still being written stays for the next read) with
the byte offset just past each, so the caller can commit records to the database and then
advance its offset: a restart re-reads at most what was not yet committed, and nothing is
skipped. Lines that are not JSON objects are reported, not silently dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MAX_READ_BYTES = 4 * 1024 * 1024


@dataclass
class TailBatch:
    entries: list[tuple[int, dict]] = field(default_factory=list)  # (line offset, record)
    bad_lines: list[str] = field(default_factory=list)
    end_offset: int = 0

    @property
    def records(self) -> list[dict]:
        return [record for _, record in self.entries]


def read_new_lines(path: Path, offset: int, max_bytes: int = MAX_READ_BYTES) -> TailBatch:
    """Parse the complete lines of `path` after `offset`; `end_offset` is past the last one."""
    batch = TailBatch(end_offset=offset)
    try:
        with path.open("rb") as f:
            if offset > path.stat().st_size:  # the file was replaced: read it again
                offset = batch.end_offset = 0
            f.seek(offset)
            chunk = f.read(max_bytes)
    except FileNotFoundError:
        return batch
    last_newline = chunk.rfind(b"\n")
    if last_newline < 0:
        return batch
    position = offset
    for raw in chunk[: last_newline + 1].split(b"\n")[:-1]:
        line_offset, position = position, position + len(raw) + 1
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            batch.bad_lines.append(line)
            continue
        if isinstance(record, dict):
            batch.entries.append((line_offset, record))
        else:
            batch.bad_lines.append(line)
    batch.end_offset = offset + last_newline + 1
    return batch


class OffsetStore:
    """Byte offsets per tailed file, kept in a small JSON file in the run directory.

    Written only after the records up to that offset are committed, so it can lag behind
    the database (harmless: ingestion is idempotent) but never run ahead of it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: dict[str, int] = self._load()

    def _load(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return {str(k): int(v) for k, v in data.items() if isinstance(v, int)}

    def get(self, name: str) -> int:
        return self.offsets.get(name, 0)

    def set(self, name: str, offset: int) -> None:
        if self.offsets.get(name) == offset:
            return
        self.offsets[name] = offset
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.offsets))
        tmp.replace(self.path)
