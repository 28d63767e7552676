"""The SLURM executor's pure parts: the batch script, the record parser, the mapping of
SLURM end states onto exit codes and outcomes, and following a growing output file."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from jobs.orchestration.policy import Verdict, classify_exit
from jobs.recipe.exit_codes import ExitCode
from worker.config import WorkerConfig
from worker.executors.slurm import FollowedFile, SlurmAttempt, batch_script, parse_job_record
from worker.launcher import LaunchSpec


def _spec(tmp_path: Path, **kw) -> LaunchSpec:
    return LaunchSpec(job_id="j1", attempt=3, run_dir=tmp_path, **kw)


def test_the_script_asks_for_the_job_resources_and_the_worker_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEYARD_DATABASE_URL", "postgresql://u:secret@db/x")
    config = WorkerConfig(slurm_partition="gpu", slurm_account="ml", slurm_qos="high",
                          slurm_time_limit="04:00:00", slurm_cpus_per_gpu=6,
                          slurm_extra_args="--constraint='h100|h200' --exclusive")  # fmt: skip
    script = batch_script(
        _spec(tmp_path, nnodes=2, nproc_per_node=4, accelerator="cuda"), config, tmp_path
    )
    for line in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--cpus-per-task=24",
                 "--partition=gpu", "--account=ml", "--qos=high", "--time=04:00:00",
                 "--signal=TERM@120", "--no-requeue", "--job-name=ty-j1-a3", "--exclusive",
                 "'--constraint=h100|h200'", f"--output={tmp_path}/slurm-a3.out"):  # fmt: skip
        assert f"#SBATCH {line}" in script or f"#SBATCH --{line.lstrip('-')}" in script, line
    assert "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1" in script
    assert '--nnodes "$SLURM_NNODES" --nproc_per_node 4' in script
    assert '--rdzv_endpoint "$head_node:' in script and "--max-restarts 0" in script
    assert "secret" not in script and "DATABASE_URL" not in script
    assert "export CUDA_VISIBLE_DEVICES" not in script  # SLURM sets it from the allocation
    assert "export OMP_NUM_THREADS=6" in script


def test_a_cpu_job_gets_one_cpu_per_rank_and_no_gpus(tmp_path):
    script = batch_script(_spec(tmp_path, nproc_per_node=2), WorkerConfig(), tmp_path)
    assert "--cpus-per-task=2" in script and "gpus-per-node" not in script
    assert "--partition" not in script and "--time" not in script  # empty: the cluster's defaults
    assert "export CUDA_VISIBLE_DEVICES=''" in script


def test_parse_job_record():
    line = "JobId=7 JobName=ty-j1-a3 JobState=CANCELLED Reason=None ExitCode=0:15 RunTime=00:00:05"
    record = parse_job_record(line)
    assert (record["JobState"], record["ExitCode"], record["JobName"]) == (
        "CANCELLED",
        "0:15",
        "ty-j1-a3",
    )


def _ended(tmp_path: Path, state: str, exit_code: str = "0:0") -> SlurmAttempt:
    attempt = SlurmAttempt(_spec(tmp_path), WorkerConfig(), tmp_path, "42")
    attempt._final, attempt.state, attempt.exit_code = state, state, exit_code
    return attempt


@pytest.mark.parametrize(
    ("state", "exit_code", "verdict", "code"),
    [
        ("COMPLETED", "0:0", Verdict.SUCCEEDED, None),
        ("FAILED", "3:0", Verdict.FAILED, "data_error"),
        ("FAILED", "1:0", Verdict.RETRY, "crash"),
        ("FAILED", "0:9", Verdict.RETRY, None),
        ("TIMEOUT", "0:15", Verdict.RETRY, "preempted"),
        ("PREEMPTED", "0:15", Verdict.RETRY, "preempted"),
        ("NODE_FAIL", "0:0", Verdict.RETRY, "node_fail"),
        ("BOOT_FAIL", "0:0", Verdict.RETRY, "node_fail"),
        ("LOST", "0:0", Verdict.RETRY, "node_fail"),
        ("OUT_OF_MEMORY", "0:125", Verdict.FAILED, "out_of_memory"),
        ("DEADLINE", "0:0", Verdict.FAILED, "slurm_deadline"),
    ],
)
def test_end_states_map_onto_the_outcome_catalogue(tmp_path, state, exit_code, verdict, code):
    attempt = _ended(tmp_path, state, exit_code)
    outcome = attempt.outcome() or classify_exit(attempt.returncode(), None)
    assert outcome.verdict == verdict, outcome
    if code:
        assert outcome.code == code, outcome


def test_a_cancelled_job_reads_as_killed_by_sigterm(tmp_path):
    assert _ended(tmp_path, "CANCELLED").returncode() == -15
    assert _ended(tmp_path, "TIMEOUT").returncode() == ExitCode.PREEMPTED


def test_a_followed_file_yields_lines_as_they_come_and_ends_with_the_job(tmp_path):
    path, ended = tmp_path / "out", threading.Event()
    follower = FollowedFile(path, ended.is_set, poll_s=0.01)

    def write() -> None:
        time.sleep(0.05)  # the file appears only once the job starts
        with path.open("ab") as handle:
            handle.write(b"one\ntw")
            handle.flush()
            time.sleep(0.05)
            handle.write(b"o\nthree")  # no newline at the end
        ended.set()

    threading.Thread(target=write).start()
    assert [follower.readline() for _ in range(4)] == [b"one\n", b"two\n", b"three", b""]


def test_a_job_that_never_wrote_output_ends_the_follower(tmp_path):
    assert FollowedFile(tmp_path / "none", lambda: True, poll_s=0.01).readline() == b""
