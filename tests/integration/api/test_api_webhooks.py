"""`/v1/projects/{name}/webhooks` on PostgreSQL and SQLite: admin only, scoped to the
caller's project, the secret never answered, field errors with a fix, and deliveries
listed as the outbox holds them after a real transition."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.orchestration.states import transition
from jobs.store.status import JobStatus
from jobs.store.tables import Job, Project

SECRET = "a-very-secret-value-0123456789"
HOOK = {
    "url": "https://ci.example.com/tuneyard?team=nlp",
    "events": ["job.succeeded"],
    "secret": SECRET,
}


def hooks_url(stack: Any, project: str | None = None) -> str:
    return f"/v1/projects/{project or stack.project}/webhooks"


def create(client: Any, stack: Any, **changes: Any) -> Any:
    return client.post(hooks_url(stack), json={**HOOK, **changes}, headers=stack.headers("admin"))


def test_an_admin_creates_lists_reads_and_deletes_without_the_secret(client, stack) -> None:
    created = create(client, stack, events=["job.failed", "job.succeeded", "job.failed"])
    assert created.status_code == 201, created.text
    hook = created.json()
    assert hook["url"] == HOOK["url"] and hook["events"] == ["job.failed", "job.succeeded"]
    admin = stack.headers("admin")
    listed = client.get(hooks_url(stack), headers=admin)
    one = client.get(f"{hooks_url(stack)}/{hook['id']}", headers=admin)
    for answer in (created, listed, one):
        assert answer.status_code in (200, 201) and SECRET not in answer.text
        assert "secret" not in answer.text
    assert hook["id"] in [h["id"] for h in listed.json()["data"]]
    assert one.json() == hook
    gone = client.delete(f"{hooks_url(stack)}/{hook['id']}", headers=admin)
    assert gone.status_code == 204
    assert client.get(f"{hooks_url(stack)}/{hook['id']}", headers=admin).status_code == 404


def test_field_errors_name_the_field_and_a_fix(client, stack) -> None:
    answer = client.post(
        hooks_url(stack),
        json={
            "url": "ftp://ci.example.com/x",
            "events": ["job.succeded"],
            "secret": "short",
            "retries": 3,
        },
        headers=stack.headers("admin"),
    )
    assert answer.status_code == 422
    errors = {e["loc"]: e for e in answer.json()["errors"]}
    assert set(errors) == {"url", "events.0", "secret", "retries"}
    assert all(e["fix"] for e in errors.values())
    assert "job.succeeded" in errors["events.0"]["fix"]
    assert SECRET not in answer.text and "short" not in answer.text
    for changes, loc, words in [
        ({"url": "https://u:p@ci.example.com/x"}, "url", "credentials"),
        ({"events": []}, "events", "at least 1"),
        ({"secret": "tab\there-0123456789"}, "secret", "control"),
        ({"secret": "\ud800-0123456789abcdef"}, "secret", "surrogate"),
        ({"url": "https://ci.example.com/\ud800"}, "url", "unicode"),
        ({"url": "https://bücher.example/x"}, "url", "non-ASCII"),
    ]:
        refused = client.post(
            hooks_url(stack),
            content=json.dumps({**HOOK, **changes}),
            headers={**stack.headers("admin"), "Content-Type": "application/json"},
        )
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["errors"]
        assert error["loc"] == loc and words in error["msg"] and error["fix"]


def test_private_addresses_follow_the_backends_default(client, stack) -> None:
    answer = create(client, stack, url="http://127.0.0.1:9/hook")
    if stack.backend == "sqlite":  # the embedded default: a receiver on loopback is allowed
        assert answer.status_code == 201, answer.text
        client.delete(f"{hooks_url(stack)}/{answer.json()['id']}", headers=stack.headers("admin"))
        return
    assert answer.status_code == 422
    [error] = answer.json()["errors"]
    assert error["loc"] == "url" and "TUNEYARD_WEBHOOK_ALLOW_PRIVATE" in error["fix"]


@pytest.mark.parametrize("role", ["submit", "read"])
def test_only_an_admin_manages_webhooks(client, stack, role) -> None:
    hook = create(client, stack).json()
    headers = stack.headers(role)
    base = hooks_url(stack)
    for answer in (
        client.post(base, json=HOOK, headers=headers),
        client.get(base, headers=headers),
        client.get(f"{base}/{hook['id']}/deliveries", headers=headers),
        client.delete(f"{base}/{hook['id']}", headers=headers),
    ):
        assert answer.status_code == 403, answer.text
        assert "admin" in answer.json()["error"]["message"]
    client.delete(f"{base}/{hook['id']}", headers=stack.headers("admin"))


def test_another_projects_webhooks_are_not_found(client, stack) -> None:
    hook = create(client, stack).json()
    theirs = stack.headers("other")  # admin of another project
    other_base = hooks_url(stack, stack.project + "-other")
    missing = client.get(f"{other_base}/{2**31 - 1}", headers=theirs)
    for answer in (
        client.get(hooks_url(stack), headers=theirs),
        client.get(f"{other_base}/{hook['id']}", headers=theirs),
        client.get(f"{other_base}/{hook['id']}/deliveries", headers=theirs),
        client.delete(f"{other_base}/{hook['id']}", headers=theirs),
    ):
        assert answer.status_code == 404, answer.text
    assert missing.status_code == 404
    assert client.get(f"{other_base}/{2**40}", headers=theirs).status_code == 422
    still = client.get(f"{hooks_url(stack)}/{hook['id']}", headers=stack.headers("admin"))
    assert still.status_code == 200
    client.delete(f"{hooks_url(stack)}/{hook['id']}", headers=stack.headers("admin"))


def test_deliveries_list_what_the_outbox_holds(client, stack) -> None:
    hook = create(client, stack, events=["job.starting", "job.running"]).json()
    with stack.session() as session:
        project = session.query(Project).filter_by(name=stack.project).one()
        job = Job(project_id=project.id, name="hooked")
        session.add(job)
        session.commit()
        for status in (JobStatus.STARTING, JobStatus.RUNNING):
            transition(session, job.id, status, reason="test")
            session.commit()
    base = f"{hooks_url(stack)}/{hook['id']}/deliveries"
    admin = stack.headers("admin")
    first = client.get(base, params={"limit": 1}, headers=admin).json()
    assert first["has_more"] and first["next_cursor"]
    second = client.get(base, params={"cursor": first["next_cursor"]}, headers=admin).json()
    assert not second["has_more"] and second["next_cursor"] is None
    newest, oldest = first["data"][0], second["data"][0]
    assert (newest["event"], oldest["event"]) == ("job.running", "job.starting")
    assert newest["status"] == "pending" and newest["attempts"] == 0
    assert newest["next_attempt_at"] and newest["last_status_code"] is None
    assert (
        newest["payload"]["id"] == newest["id"] and newest["payload"]["data"]["job"]["id"] == job.id
    )
    bad = client.get(base, params={"cursor": "x"}, headers=admin)
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == "cursor"
    client.delete(f"{hooks_url(stack)}/{hook['id']}", headers=admin)
    assert client.get(base, headers=admin).status_code == 404
