"""The issue's done-when checks with the real trainer under torchrun (tiny Llama, CPU):
success with live metrics, cancel, worker SIGKILL and takeover, Redis flush, two-node gang."""

from __future__ import annotations

import time

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

from worker import proctree

pytestmark = pytest.mark.slow


def _status(job_id: str) -> str:
    return job_row(job_id).status


def _finished(job_id: str):
    row = job_row(job_id)
    return row if row.status in ("succeeded", "failed", "cancelled") else None


def test_job_submitted_through_the_api_succeeds_with_live_metrics(ty_env, procs, tiny_assets):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from jobs.store.settings import get_settings

    body = {"name": "live", "recipe": tiny_recipe(tiny_assets, 80, checkpoint_every=40),
            "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}}  # fmt: skip
    with TestClient(create_app(get_settings())) as client:
        created = client.post("/v1/jobs", json=body)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        procs.worker("w1", trainer=None)

        def live_metrics():
            job = client.get(f"/v1/jobs/{job_id}").json()
            items = client.get(f"/v1/jobs/{job_id}/metrics", params={"kind": "train"}).json()
            return job["status"] == "running" and len(items["data"]) > 0

        assert wait_for(live_metrics, 90, "train metrics in the API while running", procs, 0.05)
        row = wait_for(lambda: _finished(job_id), 120, "job to finish", procs)
        assert row.status == "succeeded", procs.logs()
        metrics = client.get(f"/v1/jobs/{job_id}/metrics", params={"kind": "train", "limit": 1000})
        lines = [line["text"] for line in client.get(f"/v1/jobs/{job_id}/logs").json()["data"]]
    # A succeeded run's log reads as a run: its start, steps, checkpoints and end.
    said = [line for line in lines if line.startswith("[tuneyard] ")]
    assert said[0] == "[tuneyard] training started at step 0", lines
    assert any(line.startswith("[tuneyard] checkpoint saved at step 40: ") for line in said)
    assert said[-1].startswith("[tuneyard] finished at step 80 · loss "), lines
    steps = [m["step"] for m in metrics.json()["data"]]
    assert steps == list(range(1, 81)) == train_steps(job_id)
    assert not proctree.tagged_pids(job_id)


def test_cancel_mid_run_ends_cancelled_with_no_process_left(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 100_000, checkpoint_every=100_000))
    procs.worker("w1", trainer=None)
    wait_for(lambda: len(train_steps(job_id)) >= 3, 90, "training to start", procs)
    from fastapi.testclient import TestClient

    from api.main import create_app

    asked = time.monotonic()
    with TestClient(create_app()) as client:
        answer = client.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 200 and answer.json()["status"] == "cancelling", answer.text
    row = wait_for(lambda: _finished(job_id), 15, "job to be cancelled", procs)
    assert row.status == "cancelled" and time.monotonic() - asked < 15
    with TestClient(create_app()) as client:
        lines = [line["text"] for line in client.get(f"/v1/jobs/{job_id}/logs").json()["data"]]
    # The stop is said in a few lines (why, what the trainer did), never a traceback.
    assert "[tuneyard] cancel requested: stopping every process of this attempt" in lines
    assert "[tuneyard] torchrun stopped by SIGTERM: every rank was asked to stop" in lines
    shown = "\n".join(lines)
    assert "Traceback" not in shown and "SignalException" not in shown, shown
    assert not proctree.tagged_pids(job_id)
    assert no_process_mentions(row.run_dir)


def test_worker_sigkill_mid_run_is_taken_over_and_resumes(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 120, checkpoint_every=20))
    procs.scheduler()
    procs.worker("w1", trainer=None)
    wait_for(lambda: len(train_steps(job_id)) >= 30, 90, "steps past a checkpoint", procs)
    procs.kill("w1")
    procs.worker("w2", trainer=None)
    row = wait_for(lambda: _finished(job_id), 150, "job to finish on w2", procs)
    assert (row.status, row.attempt) == ("succeeded", 2), procs.logs()
    assert train_steps(job_id) == list(range(1, 121))
    resumed = [
        e for e in events_of(job_id) if e.kind == "trainer" and e.message.startswith("resumed")
    ]
    assert resumed and resumed[0].attempt == 2 and resumed[0].data["step"] >= 20
    takeover = [e for e in events_of(job_id) if e.to_status == "retrying"]
    assert takeover and "lease of worker w1 expired" in takeover[0].message


def test_redis_flushed_with_jobs_queued_still_runs_each_once(project_id, procs, tiny_assets):
    import redis
    from worker_harness import REDIS_URL

    job_ids = [
        insert_job(project_id, tiny_recipe(tiny_assets, 5, checkpoint_every=5)) for _ in range(2)
    ]
    redis.Redis.from_url(REDIS_URL).flushdb()
    procs.scheduler()
    procs.worker("w1", trainer=None, concurrency=2)
    for job_id in job_ids:
        row = wait_for(lambda j=job_id: _finished(j), 120, f"job {job_id} to finish", procs)
        assert (row.status, row.attempt) == ("succeeded", 1)
        assert train_steps(job_id) == [1, 2, 3, 4, 5]
        claims = [e for e in events_of(job_id) if e.to_status == "starting"]
        assert len(claims) == 1


def test_two_workers_run_one_two_node_job(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 20, world=2, checkpoint_every=10),
                        nnodes=2)  # fmt: skip
    procs.worker("w1", trainer=None)
    procs.worker("w2", trainer=None)
    row = wait_for(lambda: _finished(job_id), 150, "two-node job to finish", procs)
    assert row.status == "succeeded", (row.error_code, row.error_message, procs.logs())
    assert train_steps(job_id) == list(range(1, 21))
    slots = [e for e in events_of(job_id) if e.kind == "gang_slot"]
    assert sorted(e.data["worker"] for e in slots) == ["w1", "w2"]
    started = [
        e for e in events_of(job_id) if e.kind == "trainer" and e.message.startswith("started")
    ]
    assert started and started[0].data.get("world_size") == 2


def test_losing_one_node_restarts_the_gang_from_latest(project_id, procs, tiny_assets):
    job_id = insert_job(project_id, tiny_recipe(tiny_assets, 100, world=2, checkpoint_every=10),
                        nnodes=2)  # fmt: skip
    procs.scheduler()
    procs.worker("w1", trainer=None)
    procs.worker("w2", trainer=None)
    wait_for(lambda: len(train_steps(job_id)) >= 15, 120, "gang to train past a checkpoint", procs)
    follower = next(e.data["worker"] for e in events_of(job_id) if e.kind == "gang_slot"
                    and e.data["node_rank"] == 1)  # fmt: skip
    procs.kill(follower)
    procs.worker("w3", trainer=None)
    row = wait_for(lambda: _finished(job_id), 180, "gang to finish on attempt 2", procs)
    assert row.status == "succeeded" and row.attempt >= 2, (row.error_message, procs.logs())
    assert train_steps(job_id) == list(range(1, 101))
    resumed = [
        e for e in events_of(job_id) if e.kind == "trainer" and e.message.startswith("resumed")
    ]
    assert resumed and resumed[0].data["step"] >= 10
