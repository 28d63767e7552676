"""Process tags: every process of an attempt is found by its tag and stopped."""

from __future__ import annotations

from pathlib import Path

from worker import proctree


def test_run_tags_select_job_attempt_and_node():
    assert proctree._tag_matches("j:2:0", "j", None, None)
    assert proctree._tag_matches("j:2:1", "j", 2, 1)
    assert not proctree._tag_matches("j:2:1", "j", 3, None)
    assert not proctree._tag_matches("jj:2:1", "j", None, None)
    assert not proctree._tag_matches("garbage", "j", None, None)


def test_tagged_processes_are_found_and_stopped(tmp_path: Path):
    import os
    import subprocess
    import sys

    env = {**os.environ, proctree.RUN_TAG_ENV: proctree.run_tag("unit-job", 1)}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                            start_new_session=True)  # fmt: skip
    try:
        assert proctree.tagged_pids("unit-job") == [proc.pid]
        assert proctree.tagged_pids("unit-job", attempt=2) == []
        assert proctree.stop_job_processes("unit-job", 1, grace_s=2.0)
        assert proc.wait(5) != 0
    finally:
        proc.kill()
