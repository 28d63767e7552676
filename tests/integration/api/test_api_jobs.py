"""Submitting, reading, listing and controlling jobs through `/v1/jobs`."""

from __future__ import annotations

import copy
import uuid

from sqlalchemy import select

from jobs.orchestration.states import transition
from jobs.store.tables import Job


def submit(client, stack, body, role="submit", **headers):
    return client.post("/v1/jobs", json=body, headers={**stack.headers(role), **headers})


def test_submit_stores_queues_and_returns_the_plan(client, stack, body, redis_db1) -> None:
    answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["status"] == "queued" and job["queue"] == "cpu"
    assert job["plan"]["world_size"] == 1 and job["max_steps"] == 20
    assert job["recipe"]["optimizer"]["lr"] == 1e-3
    assert job["dispatched_at"] is not None  # the broker took it after the commit
    messages = [m.decode() for m in redis_db1.lrange("cpu", 0, -1)]
    assert any(job["id"] in m for m in messages)
    with stack.session() as s:
        row = s.get(Job, job["id"])
        assert row.spec["name"] == "tiny" and row.request_hash


def test_submit_with_yaml_and_overrides(client, stack, body) -> None:
    import yaml

    body = {"recipe_yaml": yaml.safe_dump(body["recipe"]), "overrides": ["optimizer.lr=1e-4"]}
    answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["recipe"]["optimizer"]["lr"] == 1e-4
    assert answer.json()["overrides"] == ["optimizer.lr=1e-4"]


def test_gpu_resources_pick_a_gpu_queue(client, stack, body) -> None:
    body["resources"] = {"nnodes": 1, "nproc_per_node": 2, "accelerator": "cuda"}
    answer = client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    assert answer.status_code == 200, answer.text
    assert answer.json()["queue"] == "gpu-2" and answer.json()["plan"]["world_size"] == 2


def test_broker_down_leaves_the_job_queued(stack, body) -> None:
    from fastapi.testclient import TestClient

    from api.main import create_app

    settings = stack.settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/1"})
    with TestClient(create_app(settings)) as client:
        answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["status"] == "queued" and answer.json()["dispatched_at"] is None


def test_validate_stores_nothing(client, stack, body) -> None:
    body["name"] = f"validate-only-{uuid.uuid4().hex[:6]}"
    answer = client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    assert answer.status_code == 200, answer.text
    assert answer.json()["valid"] is True and answer.json()["plan"]["max_steps"] == 20
    with stack.session() as s:
        assert s.scalar(select(Job).where(Job.name == body["name"])) is None


def test_get_and_list_newest_first_with_cursor(client, stack, body) -> None:
    label = uuid.uuid4().hex[:8]
    ids = []
    for i in range(5):
        body = copy.deepcopy(body) | {"name": f"j{i}", "labels": {"batch": label}}
        ids.append(submit(client, stack, body).json()["id"])
    got = client.get(f"/v1/jobs/{ids[0]}", headers=stack.headers("read"))
    assert got.status_code == 200 and got.json()["name"] == "j0"
    seen, cursor = [], None
    while True:
        params = {"label": f"batch={label}", "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params, headers=stack.headers("read")).json()
        seen += [j["id"] for j in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]


def test_list_filters_by_status(client, stack, body) -> None:
    label = uuid.uuid4().hex[:8]
    body["labels"] = {"batch": label}
    keep = submit(client, stack, body).json()["id"]
    gone = submit(client, stack, body).json()["id"]
    client.post(f"/v1/jobs/{gone}/cancel", headers=stack.headers())
    params = {"label": f"batch={label}", "status": "cancelled"}
    page = client.get("/v1/jobs", params=params, headers=stack.headers("read")).json()
    assert [j["id"] for j in page["data"]] == [gone]
    params["status"] = ["queued", "running"]
    page = client.get("/v1/jobs", params=params, headers=stack.headers("read")).json()
    assert [j["id"] for j in page["data"]] == [keep]


def test_cancel_pause_resume(client, stack, body) -> None:
    job_id = submit(client, stack, body).json()["id"]
    paused = client.post(f"/v1/jobs/{job_id}/pause", headers=stack.headers())
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert paused.json()["actions"] == ["cancel", "resume"]
    again = client.post(f"/v1/jobs/{job_id}/pause", headers=stack.headers())
    assert again.status_code == 200 and again.json()["status"] == "paused"  # a no-op
    resumed = client.post(f"/v1/jobs/{job_id}/resume", headers=stack.headers())
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    assert resumed.json()["dispatched_at"] is not None
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=stack.headers())
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    events = client.get(f"/v1/jobs/{job_id}/events", headers=stack.headers("read")).json()
    moves = [(e["from_status"], e["to_status"]) for e in events["data"]]
    assert moves == [(None, "queued"), ("queued", "paused"), ("paused", "queued"),
                     ("queued", "cancelled")]  # fmt: skip
    after = events["data"][1]["id"]
    rest = client.get(f"/v1/jobs/{job_id}/events", params={"after": after},
                      headers=stack.headers("read")).json()  # fmt: skip
    assert len(rest["data"]) == 2 and rest["next_after"] == events["next_after"]


def test_running_job_cancel_goes_through_cancelling(client, stack, body) -> None:
    job_id = submit(client, stack, body).json()["id"]
    with stack.session() as s:
        transition(s, job_id, "starting", reason="test claim", lease_owner="w")
        transition(s, job_id, "running", reason="test start")
        s.commit()
    pausing = client.post(f"/v1/jobs/{job_id}/pause", headers=stack.headers())
    assert pausing.json()["status"] == "pausing"
    first = client.post(f"/v1/jobs/{job_id}/cancel", headers=stack.headers())
    second = client.post(f"/v1/jobs/{job_id}/cancel", headers=stack.headers())
    assert first.json()["status"] == second.json()["status"] == "cancelling"
    assert first.json()["actions"] == []


def test_illegal_transition_is_409_with_current_state(client, stack, body) -> None:
    job_id = submit(client, stack, body).json()["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=stack.headers())
    for verb in ("cancel", "pause", "resume"):
        answer = client.post(f"/v1/jobs/{job_id}/{verb}", headers=stack.headers())
        assert answer.status_code == 409, verb
        error = answer.json()["error"]
        assert error["code"] == "illegal_transition" and error["current_status"] == "cancelled"
        assert error["job_id"] == job_id


def test_resume_of_a_queued_job_is_409(client, stack, body) -> None:
    job_id = submit(client, stack, body).json()["id"]
    answer = client.post(f"/v1/jobs/{job_id}/resume", headers=stack.headers())
    assert answer.status_code == 409 and answer.json()["error"]["current_status"] == "queued"


def test_warnings_answer_on_validate_and_stay_on_the_job(client, stack, body) -> None:
    body["recipe"] = {**body["recipe"], "ci": {"time": "00:30:00"}, "mlflow": {}}
    answer = client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    assert answer.status_code == 200, answer.text
    assert [w["loc"] for w in answer.json()["warnings"]] == ["ci", "mlflow"]
    job = submit(client, stack, body).json()
    assert [w["loc"] for w in job["warnings"]] == ["ci", "mlflow"]
    got = client.get(f"/v1/jobs/{job['id']}", headers=stack.headers("read")).json()
    assert got["warnings"] == job["warnings"] == got["plan"]["warnings"]
