"""`/v1/jobs/{job_id}` and its sub-resources name a job by its full id or a unique prefix of
at least 8 characters (`api.job_lookup`), within the caller's project only: another
project's job is never found and never makes a prefix ambiguous, and "not found" reads the
same whether another project has a matching job or not."""

from __future__ import annotations

import uuid

import pytest

from jobs.store.api_keys import verify_key
from jobs.store.tables import Job


@pytest.fixture
def ids(stack) -> dict[str, str]:
    """Jobs at chosen ids: one unique prefix, one shared by two of this project's jobs, and
    another project's job under each (plus one under a prefix of its own)."""
    base = uuid.uuid4().hex[:8]
    unique, shared, theirs = (f"{base[:-1]}{d}" for d in "012")
    made = {
        "unique": f"{unique}-0000-4000-8000-000000000001",
        "shared_a": f"{shared}-0000-4000-8000-000000000001",
        "shared_b": f"{shared}-0000-4000-8000-000000000002",
        "their_unique": f"{unique}-9999-4000-8000-000000000009",
        "their_shared": f"{shared}-9999-4000-8000-000000000009",
        "theirs": f"{theirs}-9999-4000-8000-000000000009",
    }
    with stack.session() as session:
        mine = verify_key(session, stack.keys["read"]).project_id
        other = verify_key(session, stack.keys["other"]).project_id
        for name, job_id in made.items():
            project = other if name.startswith("their") else mine
            session.add(Job(id=job_id, project_id=project, name=name, status="queued",
                            spec={}, recipe={}, plan={}, resources={}, labels={}))  # fmt: skip
        session.commit()
    return made


def test_a_unique_prefix_reads_the_job_and_its_sub_resources(client, stack, ids) -> None:
    headers = stack.headers("read")
    for prefix in (ids["unique"][:8], ids["unique"][:13], ids["unique"][:10].upper()):
        answer = client.get(f"/v1/jobs/{prefix}", headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["id"] == ids["unique"]
    for tail in ("events", "metrics", "logs", "checkpoints"):
        answer = client.get(f"/v1/jobs/{ids['unique'][:8]}/{tail}", headers=headers)
        assert answer.status_code == 200, (tail, answer.text)


def test_a_control_by_prefix_acts_on_the_full_id(client, stack, ids) -> None:
    answer = client.post(f"/v1/jobs/{ids['unique'][:8]}/cancel", headers=stack.headers())
    assert answer.status_code == 200 and answer.json()["id"] == ids["unique"]
    assert answer.json()["status"] == "cancelled"


def test_an_ambiguous_prefix_is_409_with_the_candidates(client, stack, ids) -> None:
    answer = client.get(f"/v1/jobs/{ids['shared_a'][:8]}", headers=stack.headers("read"))
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "ambiguous_job_id" and "matches 2 jobs" in error["message"]
    assert error["candidates"] == [ids["shared_a"], ids["shared_b"]]  # never another project's
    full = client.get(f"/v1/jobs/{ids['shared_b']}", headers=stack.headers("read"))
    assert full.status_code == 200 and full.json()["id"] == ids["shared_b"]


def test_a_prefix_shorter_than_8_is_422_at_job_id(client, stack, ids) -> None:
    answer = client.get(f"/v1/jobs/{ids['unique'][:7]}", headers=stack.headers("read"))
    assert answer.status_code == 422
    (error,) = answer.json()["errors"]
    assert error["loc"] == "job_id" and "too short" in error["msg"]
    assert "at least its first 8 characters" in error["fix"]


def test_another_projects_job_reads_as_no_job_at_all(client, stack, ids) -> None:
    nowhere = "ffffffff-ffff-4fff-8fff-fffffffffff0"
    for given in (ids["theirs"][:8], ids["theirs"]):
        theirs = client.get(f"/v1/jobs/{given}", headers=stack.headers("read"))
        absent = client.get(f"/v1/jobs/{nowhere[: len(given)]}", headers=stack.headers("read"))
        assert theirs.status_code == absent.status_code == 404
        assert theirs.json() == absent.json() | {
            "error": {**absent.json()["error"], "message": f"job {given} not found"}
        }
    own = client.get(f"/v1/jobs/{ids['theirs'][:8]}", headers=stack.headers("other"))
    assert own.status_code == 200 and own.json()["id"] == ids["theirs"]
