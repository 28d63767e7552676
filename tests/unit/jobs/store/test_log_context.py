"""JSON log lines carry the fields bound around them (request, job, attempt, worker)."""

from __future__ import annotations

import json
import logging
import threading

from jobs.store.log_context import JsonFormatter, current_context, log_context


def _line(record_logger: logging.Logger, message: str, **extra) -> dict:
    record = record_logger.makeRecord(record_logger.name, logging.WARNING, __file__, 1, message,
                                      (), None, extra=extra or None)  # fmt: skip
    return json.loads(JsonFormatter().format(record))


def test_bound_fields_and_extras_appear_and_unbind() -> None:
    log = logging.getLogger("tuneyard.test")
    with log_context(request_id="r1", job_id="j1"):
        with log_context(attempt=2, worker=None):
            entry = _line(log, "inside")
            assert current_context() == {"request_id": "r1", "job_id": "j1", "attempt": 2}
        outer = _line(log, "outer", worker="w9")
    after = _line(log, "after")
    assert (entry["request_id"], entry["job_id"], entry["attempt"]) == ("r1", "j1", 2)
    assert "worker" not in entry and entry["msg"] == "inside" and entry["level"] == "warning"
    assert "attempt" not in outer and outer["worker"] == "w9"
    assert not {"request_id", "job_id"} & set(after)


def test_context_does_not_leak_between_threads() -> None:
    seen: dict[str, dict] = {}

    def other() -> None:
        seen["other"] = current_context()

    with log_context(request_id="main-only"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen["other"] == {}


def test_exceptions_are_one_json_line() -> None:
    log = logging.getLogger("tuneyard.test")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = log.makeRecord(log.name, logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = JsonFormatter().format(record)
    assert "\n" not in text and "ValueError: boom" in json.loads(text)["exc"]
