"""The SLURM executor against a real one-host SLURM cluster (deploy/slurm/local-cluster.sh;
.ci/run starts it): jobs through sbatch/srun with the real trainer, cancel, a preemption by
`scancel --signal=TERM` resumed as a new attempt, and two ranks launched by srun."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from worker_harness import (
    events_of,
    insert_job,
    job_row,
    no_process_mentions,
    tiny_recipe,
    train_steps,
    wait_for,
)

from worker.executors.slurm import parse_job_record

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not shutil.which("sbatch"), reason="SLURM is not installed (deploy/slurm/local-cluster.sh)"
    ),
]
SLURM_ENV = {"TUNEYARD_EXECUTOR": "slurm", "TUNEYARD_WORKER_SLURM_POLL_SECONDS": "0.5",
             "TUNEYARD_WORKER_SLURM_SIGNAL_SECONDS": "30"}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    up = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if up.returncode != 0 or not up.stdout.strip():
        script = Path(__file__).resolve().parents[3] / "deploy" / "slurm" / "local-cluster.sh"
        subprocess.run(["bash", str(script)], check=True, timeout=300)


def _finished(job_id: str):
    row = job_row(job_id)
    return row if row.status in ("succeeded", "failed", "cancelled") else None


def _slurm_ids(job_id: str) -> list[str]:
    """SLURM job ids of the job's attempts, from its `running` events."""
    return [e.data["slurm_job_id"] for e in events_of(job_id)
            if e.to_status == "running" and (e.data or {}).get("slurm_job_id")]  # fmt: skip


def _slurm_state(slurm_id: str) -> str:
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", slurm_id], capture_output=True, text=True
    )
    return parse_job_record(done.stdout).get("JobState", "")


def test_a_job_runs_through_sbatch_with_every_step_once(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 30, checkpoint_every=15))
    procs.worker("slurm-w1", trainer=None, **SLURM_ENV)
    row = wait_for(lambda: _finished(job_id), 180, "the SLURM job to finish", procs)
    assert row.status == "succeeded", procs.logs()
    assert train_steps(job_id) == list(range(1, 31))
    (slurm_id,) = _slurm_ids(job_id)
    assert _slurm_state(slurm_id) == "COMPLETED"
    script = (Path(row.run_dir) / "slurm-a1.sbatch").read_text()
    assert "srun" in script and "--no-requeue" in script and "DATABASE_URL" not in script


def test_cancel_ends_cancelled_in_slurm_with_no_process_left(project_id, procs, tiny_assets):
    from fastapi.testclient import TestClient

    from api.main import create_app

    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 100_000, checkpoint_every=100_000))
    procs.worker("slurm-w1", trainer=None, **SLURM_ENV)
    wait_for(lambda: len(train_steps(job_id)) >= 3, 180, "training to start under SLURM", procs)
    with TestClient(create_app()) as client:
        answer = client.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 200, answer.text
    row = wait_for(lambda: _finished(job_id), 60, "the job to be cancelled", procs)
    assert row.status == "cancelled", procs.logs()
    (slurm_id,) = _slurm_ids(job_id)
    assert _slurm_state(slurm_id) == "CANCELLED"
    deadline = time.monotonic() + 20
    while not no_process_mentions(row.run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert no_process_mentions(row.run_dir)


def test_a_preemption_by_scancel_term_resumes_as_a_new_attempt(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 80, checkpoint_every=10))
    procs.worker("slurm-w1", trainer=None, **SLURM_ENV)
    wait_for(lambda: len(train_steps(job_id)) >= 25, 180, "steps past a checkpoint", procs)
    (first,) = _slurm_ids(job_id)
    subprocess.run(["scancel", "--signal=TERM", first], check=True)
    row = wait_for(lambda: _finished(job_id), 240, "the job to finish on a new attempt", procs)
    assert (row.status, row.attempt) == ("succeeded", 2), procs.logs()
    assert train_steps(job_id) == list(range(1, 81))
    resumed = [e for e in events_of(job_id)
               if e.kind == "trainer" and e.message.startswith("resumed")]  # fmt: skip
    assert resumed and resumed[0].attempt == 2 and resumed[0].data["step"] >= 10
    retried = [e for e in events_of(job_id) if e.to_status == "retrying"]
    assert retried and "preempt" in retried[0].message.lower(), [e.message for e in retried]
    assert len(set(_slurm_ids(job_id))) == 2


def test_two_ranks_are_launched_through_srun(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 10, world=2, checkpoint_every=10),
                        nnodes=1, nproc=2)  # fmt: skip
    procs.worker("slurm-w1", trainer=None, **SLURM_ENV)
    row = wait_for(lambda: _finished(job_id), 180, "the 2-rank SLURM job to finish", procs)
    assert row.status == "succeeded", procs.logs()
    started = [
        e for e in events_of(job_id) if e.kind == "trainer" and (e.data or {}).get("world_size")
    ]
    assert started and started[0].data["world_size"] == 2
    out = (Path(row.run_dir) / "slurm-a1.out").read_text() + (
        Path(row.run_dir) / "slurm-a1.err"
    ).read_text()
    assert "torchrun" in (Path(row.run_dir) / "slurm-a1.sbatch").read_text()
    assert _slurm_state(_slurm_ids(job_id)[0]) == "COMPLETED", out


def test_a_job_sbatch_refuses_fails_with_slurms_reason(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 5, checkpoint_every=5))
    procs.worker("slurm-w1", trainer=None, TUNEYARD_WORKER_SLURM_PARTITION="no-such-partition",
                 **SLURM_ENV)  # fmt: skip
    row = wait_for(lambda: _finished(job_id), 60, "the refused job to settle", procs)
    assert row.status == "failed", procs.logs()
    failed = [e for e in events_of(job_id) if e.to_status == "failed"]
    assert failed and "sbatch refused the job" in failed[0].message, [e.message for e in failed]
    assert "partition" in failed[0].message.lower()


def _unreachable_controller_conf(path: Path) -> Path:
    """This cluster's slurm.conf with the controller on a port nothing listens on: sbatch
    answers "Unable to contact slurm controller", as while slurmctld restarts."""
    real = Path("/etc/slurm/slurm.conf").read_text()
    path.write_text(real.replace("\nSlurmUser=", "\nSlurmctldPort=1\nSlurmUser=", 1))
    return path


def test_a_launch_waits_out_an_unreachable_controller(project_id, procs, tiny_assets, tmp_path):
    """The controller is unreachable when the job is claimed: the worker asks again with
    backoff, keeping the lease, and once SLURM answers the same attempt runs to the end."""
    conf = _unreachable_controller_conf(tmp_path / "slurm.conf")
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 5, checkpoint_every=5))
    procs.worker("slurm-w1", trainer=None, SLURM_CONF=str(conf),
                 TUNEYARD_WORKER_LEASE_SECONDS="60", **SLURM_ENV)  # fmt: skip
    wait_for(lambda: "asking again" in procs.logs(), 90, "a launch retry", procs)
    assert "Unable to contact slurm controller" in procs.logs()
    assert job_row(job_id).status == "starting"
    conf.write_text(Path("/etc/slurm/slurm.conf").read_text())  # the controller is back
    row = wait_for(lambda: _finished(job_id), 180, "the job to finish", procs)
    assert row.status == "succeeded" and row.attempt == 1, procs.logs()
    assert train_steps(job_id) == list(range(1, 6))


def test_a_controller_that_stays_away_fails_the_launch_after_the_retry_window(
    project_id, procs, tiny_assets, tmp_path
):
    conf = _unreachable_controller_conf(tmp_path / "slurm.conf")
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 5, checkpoint_every=5))
    procs.worker("slurm-w1", trainer=None, SLURM_CONF=str(conf),
                 TUNEYARD_WORKER_LEASE_SECONDS="60", TUNEYARD_WORKER_LAUNCH_RETRY_SECONDS="5",
                 **SLURM_ENV)  # fmt: skip
    row = wait_for(lambda: _finished(job_id), 120, "the launch to fail", procs)
    assert row.status == "failed", procs.logs()
    failed = [e for e in events_of(job_id) if e.to_status == "failed"]
    assert failed and "of retries" in failed[0].message, [e.message for e in failed]
    assert "Unable to contact slurm controller" in failed[0].message


def test_a_cancel_while_the_controller_is_away_ends_cancelled(
    project_id, procs, tiny_assets, tmp_path
):
    from fastapi.testclient import TestClient

    from api.main import create_app

    conf = _unreachable_controller_conf(tmp_path / "slurm.conf")
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 5, checkpoint_every=5))
    procs.worker("slurm-w1", trainer=None, SLURM_CONF=str(conf),
                 TUNEYARD_WORKER_LEASE_SECONDS="60", **SLURM_ENV)  # fmt: skip
    wait_for(lambda: "asking again" in procs.logs(), 90, "a launch retry", procs)
    with TestClient(create_app()) as client:
        answer = client.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 200, answer.text
    row = wait_for(lambda: _finished(job_id), 60, "the job to be cancelled", procs)
    assert row.status == "cancelled", procs.logs()
    assert _slurm_ids(job_id) == []  # it never reached SLURM
