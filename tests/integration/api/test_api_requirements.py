"""A job that requires an optional package against the live workers of its queue."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import delete

from jobs.orchestration.claims import UNMET_EVENT, claim_job, join_gang
from jobs.store.leases import record_heartbeat
from jobs.store.tables import Job, JobEvent, Worker, utcnow

TE_ADAM = "transformer_engine.pytorch.optimizers.FusedAdam"


@pytest.fixture
def gpu_queue(stack) -> Iterator[tuple[int, str]]:
    """A GPU queue no other test's workers listen on; its worker rows are removed after."""
    nproc = 3 + uuid.uuid4().int % 5
    queue = f"gpu-{nproc}"
    yield nproc, queue
    with stack.session() as session:
        session.execute(delete(Worker).where(Worker.queue == queue))
        session.commit()


def _body(body, nproc: int) -> dict:
    body = copy.deepcopy(body)
    body["recipe"]["optimizer"] = {"_target_": TE_ADAM, "lr": 1e-4}
    body["recipe"]["step_scheduler"]["global_batch_size"] = 4 * nproc
    body["resources"] = {"nnodes": 1, "nproc_per_node": nproc, "accelerator": "cuda"}
    return body


def _worker(stack, queue: str, packages: list[str], age_s: float = 0.0) -> str:
    name = f"w-{uuid.uuid4().hex[:6]}"
    with stack.session() as session:
        record_heartbeat(session, name, queue,
                         {"queues": [queue], "packages": packages}, "online")  # fmt: skip
        session.get(Worker, name).last_heartbeat = utcnow() - timedelta(seconds=age_s)
        session.commit()
    return name


def submit(client, stack, body):
    return client.post("/v1/jobs", json=body, headers=stack.headers("submit"))


def test_no_live_worker_of_the_queue_accepts_with_a_warning(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    _worker(stack, queue, ["transformer_engine"], age_s=3600)  # stale: not live
    answer = submit(client, stack, _body(body, nproc))
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["plan"]["requires"] == {"transformer_engine": "optimizer._target_"}
    [warning] = [w for w in job["warnings"] if w["loc"] == "optimizer._target_"]
    assert f"no worker of queue {queue} is live" in warning["msg"]


def test_live_workers_without_the_package_refuse_the_job(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    _worker(stack, queue, ["wandb"])
    answer = submit(client, stack, _body(body, nproc))
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["loc"] == "optimizer._target_"
    assert (
        error["msg"]
        == f"needs transformer_engine: no worker of queue {queue} has transformer_engine"
    )
    assert "pip install" in error["fix"]
    validate = client.post("/v1/jobs:validate", json=_body(body, nproc),
                           headers=stack.headers("submit"))  # fmt: skip
    assert validate.status_code == 422


def test_only_a_worker_with_the_package_claims_it(client, stack, body, gpu_queue, tmp_path):
    nproc, queue = gpu_queue
    without = _worker(stack, queue, [])
    with_te = _worker(stack, queue, ["transformer_engine"])
    answer = submit(client, stack, _body(body, nproc))
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    with stack.session() as session:
        for _ in range(2):  # a redelivered message notes the same worker once
            assert claim_job(session, job_id, without, 60, str(tmp_path), packages=[]) is None
            session.commit()
        events = session.query(JobEvent).filter_by(job_id=job_id, kind=UNMET_EVENT).all()
        assert [e.data for e in events] == [{"worker": without, "missing": ["transformer_engine"]}]
        assert session.get(Job, job_id).status == "queued"
        claim = claim_job(session, job_id, with_te, 60, str(tmp_path),
                          packages=["transformer_engine"])  # fmt: skip
        session.commit()
        assert claim is not None and session.get(Job, job_id).status == "starting"


def test_a_worker_without_the_package_does_not_join_a_gang(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    _worker(stack, queue, ["transformer_engine"])
    answer = submit(client, stack, _body(body, nproc))
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    with stack.session() as session:
        assert join_gang(session, job_id, "w-lacking", packages=[]) is None
        session.commit()
        [event] = session.query(JobEvent).filter_by(job_id=job_id, kind=UNMET_EVENT).all()
        assert event.data == {"worker": "w-lacking", "missing": ["transformer_engine"]}
