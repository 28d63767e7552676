"""Exports through the API (no worker here: `tests/integration/worker/test_export_job.py`
runs them): which checkpoint and kind a request gets, its 422s, cancel, and that another
project's export or job answers exactly like a missing one."""

from __future__ import annotations

import copy
import uuid

import pytest

from jobs.store.tables import Checkpoint


def new_job(client, stack, body, steps=(10, 20), peft=False) -> str:
    body = copy.deepcopy(body)
    if peft:
        body["recipe"]["peft"] = {"match_all_linear": True, "dim": 4, "alpha": 8}
    answer = client.post("/v1/jobs", json=body, headers=stack.headers())
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    with stack.session() as session:
        for step in steps:
            session.add(Checkpoint(job_id=job_id, step=step, path=f"/runs/{job_id}/step_{step}"))
        session.commit()
    return job_id


def export(client, stack, job_id, role="submit", **body):
    return client.post(f"/v1/jobs/{job_id}/exports", json=body, headers=stack.headers(role))


def refusal(answer, loc: str) -> dict:
    assert answer.status_code == 422, answer.text
    errors = answer.json()["errors"]
    assert [e["loc"] for e in errors] == [loc], errors
    return errors[0]


def test_an_export_defaults_to_the_latest_checkpoint_and_is_listed(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    answer = export(client, stack, job_id)
    assert answer.status_code == 201, answer.text
    created = answer.json()
    assert (created["step"], created["kind"], created["dtype"]) == (20, "full", "float32")
    assert (created["status"], created["actions"], created["terminal"]) == (
        "queued",
        ["cancel"],
        False,
    )
    chosen = export(client, stack, job_id[:8], step=10, dtype="bfloat16").json()
    assert (chosen["step"], chosen["dtype"]) == (10, "bfloat16")
    listed = client.get(f"/v1/jobs/{job_id}/exports", headers=stack.headers("read")).json()
    assert [e["id"] for e in listed["data"]] == [chosen["id"], created["id"]]
    one = client.get(f"/v1/exports/{created['id']}", headers=stack.headers("read"))
    assert one.status_code == 200 and one.json()["id"] == created["id"]


@pytest.mark.parametrize(("merge_lora", "kind"), [(True, "merged"), (False, "adapter")])
def test_a_lora_job_exports_merged_or_adapter_only(client, stack, body, merge_lora, kind) -> None:
    job_id = new_job(client, stack, body, peft=True)
    answer = export(client, stack, job_id, merge_lora=merge_lora)
    assert answer.status_code == 201, answer.text
    assert (answer.json()["kind"], answer.json()["merge_lora"]) == (kind, merge_lora)


def test_a_step_without_a_checkpoint_is_a_422_listing_the_steps(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    error = refusal(export(client, stack, job_id, step=15), "step")
    assert "no checkpoint at 15" in error["msg"] and error["fix"].endswith("10, 20")
    bare = new_job(client, stack, body, steps=())
    assert "no checkpoint yet" in refusal(export(client, stack, bare), "step")["msg"]


@pytest.mark.parametrize(
    ("field", "value"), [("dtype", "int8"), ("step", -1), ("step", "x"), ("merge", True)]
)
def test_bad_fields_are_422s_at_the_field(client, stack, body, field, value) -> None:
    job_id = new_job(client, stack, body)
    refusal(export(client, stack, job_id, **{field: value}), field)


def test_another_projects_job_and_export_answer_like_missing_ones(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    export_id = export(client, stack, job_id).json()["id"]
    missing = str(uuid.uuid4())
    for theirs, nobody in [
        (("POST", f"/v1/jobs/{job_id}/exports"), ("POST", f"/v1/jobs/{missing}/exports")),
        (("GET", f"/v1/jobs/{job_id}/exports"), ("GET", f"/v1/jobs/{missing}/exports")),
        (("GET", f"/v1/exports/{export_id}"), ("GET", f"/v1/exports/{missing}")),
        (("GET", f"/v1/exports/{export_id}/events"), ("GET", f"/v1/exports/{missing}/events")),
        (("POST", f"/v1/exports/{export_id}/cancel"), ("POST", f"/v1/exports/{missing}/cancel")),
    ]:
        kwargs = {"json": {}} if theirs[0] == "POST" else {}
        a = client.request(*theirs, headers=stack.headers("other"), **kwargs)
        b = client.request(*nobody, headers=stack.headers("other"), **kwargs)
        assert a.status_code == b.status_code == 404, (theirs, a.text)
        assert a.json()["error"]["code"] == b.json()["error"]["code"] == "not_found"
    assert client.get("/v1/exports/not-an-id", headers=stack.headers()).status_code == 404
    assert export(client, stack, job_id, role="read").status_code == 403


def test_cancel_ends_a_queued_export_and_a_second_cancel_is_a_409(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    export_id = export(client, stack, job_id).json()["id"]
    answer = client.post(f"/v1/exports/{export_id}/cancel", headers=stack.headers())
    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["terminal"]) == ("cancelled", True)
    again = client.post(f"/v1/exports/{export_id}/cancel", headers=stack.headers())
    assert again.status_code == 409
    assert again.json()["error"]["current_status"] == "cancelled"
    events = client.get(f"/v1/exports/{export_id}/events", headers=stack.headers("read")).json()
    assert [(e["kind"], e["to_status"]) for e in events["data"]] == [
        ("created", "queued"),
        ("transition", "cancelled"),
    ]
