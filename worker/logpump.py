"""Collecting a process's stdout and stderr as numbered lines for the `job_logs` table.

One daemon thread per stream reads lines as they come and appends `(stream, seq, text)`
to a bounded buffer; the supervisor takes the buffer in batches and writes it. A line is
removed from the buffer only after its batch committed (`commit`), so a database outage
delays logs but does not lose them, up to `max_lines` (beyond that the oldest go, and a
marker line says how many).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import IO

MAX_LINE_CHARS = 8192


class LogPump:
    def __init__(self, prefix: str = "", max_lines: int = 100_000) -> None:
        self.prefix = prefix
        self.max_lines = max_lines
        self._lines: deque[tuple[str, int, str]] = deque()
        self._seq: dict[str, int] = {}
        self._dropped = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def follow(self, stream_name: str, pipe: IO[bytes]) -> None:
        """Start a thread reading `pipe` until it closes."""
        name = f"{self.prefix}{stream_name}"
        thread = threading.Thread(target=self._read, args=(name, pipe), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _read(self, name: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                self.add(name, raw.decode("utf-8", errors="replace").rstrip("\n"))

    def add(self, stream: str, text: str) -> None:
        with self._lock:
            seq = self._seq.get(stream, 0)
            self._seq[stream] = seq + 1
            self._lines.append((stream, seq, text[:MAX_LINE_CHARS]))
            if len(self._lines) > self.max_lines:
                self._lines.popleft()
                self._dropped += 1

    def pending(self, limit: int = 5000) -> list[tuple[str, int, str]]:
        """Up to `limit` oldest lines not yet committed (they stay until `commit`)."""
        with self._lock:
            if self._dropped:
                stream = f"{self.prefix}stderr"
                seq = self._seq.get(stream, 0)
                self._seq[stream] = seq + 1
                self._lines.appendleft(
                    (stream, seq, f"[tuneyard: {self._dropped} log lines dropped]")
                )
                self._dropped = 0
            return [self._lines[i] for i in range(min(limit, len(self._lines)))]

    def commit(self, count: int) -> None:
        """Forget the `count` oldest lines: they are in the database."""
        with self._lock:
            for _ in range(min(count, len(self._lines))):
                self._lines.popleft()

    def wait_closed(self, timeout: float = 5.0) -> None:
        for thread in self._threads:
            thread.join(timeout)
