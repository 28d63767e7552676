"""Unit tests of the worker's pure parts: tailer, launcher command and env, outcome map,
process tags and the log pump."""

from __future__ import annotations

import io
import json
from pathlib import Path

from jobs.recipe.exit_codes import ExitCode
from worker import proctree
from worker.launcher import LaunchSpec, build_command, build_env, write_recipe
from worker.logpump import LogPump
from worker.outcome import FAILED, RETRY, SUCCEEDED, classify_exit
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


def test_single_node_command_is_standalone(tmp_path: Path):
    spec = LaunchSpec(job_id="j", attempt=2, run_dir=tmp_path, nproc_per_node=2)
    cmd = build_command(spec)
    assert "--standalone" in cmd and "--rdzv-backend" not in cmd
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert cmd[-5:] == ["trainer", "--recipe", str(tmp_path / "recipe.yaml"), "--run-dir",
                        str(tmp_path)]  # fmt: skip


def test_multi_node_command_uses_c10d_with_a_per_attempt_id(tmp_path: Path):
    spec = LaunchSpec(job_id="j", attempt=3, run_dir=tmp_path, nnodes=2,
                      rdzv_endpoint="10.0.0.1:29400")  # fmt: skip
    cmd = build_command(spec)
    assert "--standalone" not in cmd
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    assert cmd[cmd.index("--rdzv-id") + 1] == "j-3"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert cmd[cmd.index("--nnodes") + 1] == "2"


def test_multi_node_without_endpoint_is_refused(tmp_path: Path):
    import pytest

    with pytest.raises(ValueError, match="rdzv_endpoint"):
        build_command(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, nnodes=2))


def test_env_sets_threads_devices_backend_and_tag(tmp_path: Path):
    cpu = build_env(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, nproc_per_node=2), {})
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["TUNEYARD_DIST_BACKEND"] == "gloo"
    assert int(cpu["OMP_NUM_THREADS"]) >= 1
    assert cpu[proctree.RUN_TAG_ENV] == "j:1:0"
    gpu = build_env(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, accelerator="cuda",
                               gpu_ids=(2, 3), node_rank=1), {"OMP_NUM_THREADS": "4"})  # fmt: skip
    assert gpu["CUDA_VISIBLE_DEVICES"] == "2,3" and gpu["TUNEYARD_DIST_BACKEND"] == "nccl"
    assert gpu["OMP_NUM_THREADS"] == "4" and gpu[proctree.RUN_TAG_ENV] == "j:1:1"


def test_write_recipe_is_yaml(tmp_path: Path):
    import yaml

    path = write_recipe(tmp_path / "run", {"step_scheduler": {"max_steps": 3}})
    assert yaml.safe_load(path.read_text()) == {"step_scheduler": {"max_steps": 3}}


def test_outcome_map_user_errors_fail_infra_errors_retry():
    assert classify_exit(0, None).verdict == SUCCEEDED
    nan = {"event": "failed", "code": "nan_loss", "exit_code": 4, "message": "loss nan at 7"}
    assert classify_exit(1, nan) == classify_exit(1, nan)
    assert classify_exit(1, nan).verdict == FAILED and classify_exit(1, nan).code == "nan_loss"
    crash = {"event": "failed", "code": "crash", "exit_code": 1, "message": "boom"}
    assert classify_exit(1, crash).verdict == RETRY
    assert classify_exit(1, {"event": "preempted", "step": 3}).verdict == RETRY
    assert classify_exit(ExitCode.PREEMPTED, None).code == "preempted"
    assert classify_exit(-9, None).verdict == RETRY and classify_exit(-9, None).code == "killed"
    assert classify_exit(ExitCode.INVALID_RECIPE, None).verdict == FAILED
    assert classify_exit(1, None).code == "crash"


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


def test_failed_event_json_shape_matches_the_contract():
    # the trainer's failed event carries code / exit_code / message (see jobs.recipe.exit_codes)
    record = json.loads(
        '{"event":"failed","step":3,"code":"data_error","exit_code":3,"message":"x"}'
    )
    assert classify_exit(1, record).verdict == FAILED
