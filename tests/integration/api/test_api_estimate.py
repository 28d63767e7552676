"""Submit against a queue's capacity: the device memory its live workers advertise refuses
a job whose estimate cannot fit (422 at `distributed`, with fixes), and the throughput its
succeeded jobs measured replaces the default behind the estimate's time."""

from __future__ import annotations

import copy
import statistics
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import delete, update

from jobs.store.leases import record_heartbeat
from jobs.store.tables import Job, Metric, Worker


@pytest.fixture
def gpu_queue(stack) -> Iterator[tuple[int, str]]:
    """A GPU queue no other test uses; its workers and jobs are removed after."""
    nproc = 9 + uuid.uuid4().int % 50
    queue = f"gpu-{nproc}"
    yield nproc, queue
    with stack.session() as session:
        session.execute(delete(Worker).where(Worker.queue == queue))
        session.execute(delete(Job).where(Job.queue == queue))
        session.commit()


@pytest.fixture(autouse=True)
def capacity_read_every_submit(stack):
    """These tests change a queue's workers and jobs between submits: no kept answer."""
    cache = stack.app.state.capacity
    kept, cache.ttl = cache.ttl, 0
    yield
    cache.ttl = kept


def _body(body, nproc: int) -> dict:
    body = copy.deepcopy(body)
    body["recipe"]["step_scheduler"]["global_batch_size"] = 4 * nproc
    body["resources"] = {"nnodes": 1, "nproc_per_node": nproc, "accelerator": "cuda"}
    return body


def _worker(stack, queue: str, memory) -> None:
    with stack.session() as session:
        resources = {"queues": [queue], "packages": [], "device_memory_bytes": memory}
        record_heartbeat(session, f"w-{uuid.uuid4().hex[:6]}", queue, resources, "online")
        session.commit()


def _submit(client, stack, body, path: str = "/v1/jobs"):
    return client.post(path, json=body, headers=stack.headers("submit"))


def test_a_job_that_cannot_fit_the_queues_devices_is_refused(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    _worker(stack, queue, 80 << 30)
    _worker(stack, queue, 2 << 20)  # the smallest device decides: any worker may claim it
    for path in ("/v1/jobs", "/v1/jobs:validate"):
        answer = _submit(client, stack, _body(body, nproc), path)
        assert answer.status_code == 422, answer.text
        [error] = answer.json()["errors"]
        assert error["loc"] == "distributed"
        assert "the device has 2 MiB, 2 MiB usable" in error["msg"]
        assert error["fix"].startswith("cheapest first: 1) ")


def test_a_job_that_fits_is_queued_with_the_verdict(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    _worker(stack, queue, 80 << 30)
    _worker(stack, queue, "a lot")  # not a size: ignored, never a 500
    answer = _submit(client, stack, _body(body, nproc))
    assert answer.status_code == 201, answer.text
    fit = answer.json()["plan"]["estimate"]["fit"]
    assert fit["fits"] is True and fit["device_memory_bytes"] == 80 << 30


@pytest.mark.parametrize(("ratio", "status"), [(1.2, 422), (0.8, 201)])
def test_submit_refuses_at_1_2x_the_device_and_accepts_at_0_8x(
    client, stack, body, gpu_queue, ratio, status
):
    """The estimate the plan states is what the submit's fit check compares with the
    smallest advertised device: 1.2x it is refused with fixes, 0.8x it is queued."""
    nproc, queue = gpu_queue
    checked = _submit(client, stack, _body(body, nproc), "/v1/jobs:validate")
    assert checked.status_code == 200, checked.text
    total = checked.json()["plan"]["estimate"]["memory_per_rank_bytes"]["total"]
    _worker(stack, queue, int(total / ratio))
    answer = _submit(client, stack, _body(body, nproc))
    assert answer.status_code == status, answer.text
    if status == 422:
        [error] = answer.json()["errors"]
        assert error["loc"] == "distributed" and error["fix"].startswith("cheapest first: 1) ")
    else:
        fit = answer.json()["plan"]["estimate"]["fit"]
        assert fit["fits"] is True and fit["device_memory_bytes"] == int(total / ratio)


def test_no_worker_that_says_its_memory_means_no_check(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    _worker(stack, queue, None)
    answer = _submit(client, stack, _body(body, nproc))
    assert answer.status_code == 201, answer.text
    assert "fit" not in answer.json()["plan"]["estimate"]


def test_the_queue_learns_its_throughput_from_succeeded_jobs(client, stack, body, gpu_queue):
    nproc, queue = gpu_queue
    first = _submit(client, stack, _body(body, nproc))
    assert first.status_code == 201, first.text
    job = first.json()
    assert job["plan"]["estimate"]["basis"]["throughput"] == "default"
    per_token = job["plan"]["estimate"]["flops_per_token"]
    tps = [999.0, 100.0, 120.0, 110.0]  # step 1 (warm-up) is left out
    with stack.session() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(status="succeeded"))
        session.add_all(Metric(job_id=job["id"], kind="train", step=i + 1, tps_per_rank=v)
                        for i, v in enumerate(tps))  # fmt: skip
        session.commit()
    second = _submit(client, stack, _body(body, nproc))
    assert second.status_code == 201, second.text
    basis = second.json()["plan"]["estimate"]["basis"]
    assert basis["throughput"] == "learned from this queue's finished jobs"
    assert basis["throughput_flops_per_rank"] == pytest.approx(
        per_token * statistics.median(tps[1:])
    )
