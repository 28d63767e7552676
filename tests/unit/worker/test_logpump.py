"""The log pump numbers output lines and keeps them until their batch is committed."""

from __future__ import annotations

import io

from worker.logpump import LogPump


def test_log_pump_numbers_lines_and_keeps_them_until_committed():
    pump = LogPump(prefix="n1:", max_lines=3)
    pump.follow("stdout", io.BytesIO(b"a\nb\n"))
    pump.wait_closed()
    assert pump.pending() == [("n1:stdout", 0, "a"), ("n1:stdout", 1, "b")]
    pump.commit(1)
    assert pump.pending() == [("n1:stdout", 1, "b")]
    for i in range(5):
        pump.add("n1:stdout", str(i))
    lines = pump.pending()
    assert lines[0][2] == "[tuneyard: 3 log lines dropped]" and len(lines) == 4
