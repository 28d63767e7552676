"""A failing rank's record: written whole under its rank's name from torchrun's environment,
and a SIGTERM that arrives while the rank reports waits until the report is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.recipe.exit_codes import ExitCode, RankFailure
from trainer.failure_record import rank_failure, sigterm_deferred, write_failure_record

REPO = Path(__file__).resolve().parents[3]


def test_rank_failure_reads_rank_world_and_attempt_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TUNEYARD_ATTEMPT", "2")
    failure = rank_failure(ExitCode.DATA_ERROR, "bad row", "drop it", 7)
    assert (failure.rank, failure.world_size, failure.attempt, failure.step) == (3, 4, 2, 7)
    assert failure.code == "data_error" and failure.timestamp > 1e9
    for name in ("RANK", "WORLD_SIZE", "TUNEYARD_ATTEMPT"):
        monkeypatch.delenv(name)
    alone = rank_failure(ExitCode.CRASH, "boom", "", 0)
    assert (alone.rank, alone.world_size, alone.attempt) == (0, 1, None)


def test_the_record_is_published_whole_under_its_rank(tmp_path: Path):
    failure = RankFailure(1, 3, "bad row", "drop it", 2, 1.0e9, 2, 1)
    path = write_failure_record(tmp_path, failure)
    assert path == tmp_path / "failures" / "rank-1.json"
    assert RankFailure.from_json(json.loads(path.read_text())) == failure
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank-1.json"]  # no staging left


def test_a_record_that_cannot_be_written_is_reported_not_raised(tmp_path: Path, capsys):
    (tmp_path / "failures").write_text("a file where the folder goes")
    assert write_failure_record(tmp_path, RankFailure(0, 1, "boom", timestamp=1.0)) is None
    assert "cannot write" in capsys.readouterr().err


def test_sigterm_waits_for_the_block_then_runs_the_previous_handler():
    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("handler"))
    try:
        with sigterm_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            seen.append("block done")
        assert seen == ["block done", "handler"]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # restored, not lost
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("sigterm", [True, False], ids=["sigterm", "no-signal"])
def test_a_rank_killed_while_reporting_still_leaves_its_record(tmp_path: Path, sigterm: bool):
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from jobs.recipe.exit_codes import RankFailure\n"
        "from trainer.failure_record import sigterm_deferred, write_failure_record\n"
        "with sigterm_deferred():\n"
        f"    if {sigterm}: os.kill(os.getpid(), signal.SIGTERM)\n"
        "    write_failure_record(Path(sys.argv[1]), RankFailure(0, 3, 'bad', timestamp=1.0))\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, timeout=60)
    assert done.returncode == (-signal.SIGTERM if sigterm else 3)
    assert json.loads((tmp_path / "failures" / "rank-0.json").read_text())["message"] == "bad"
