"""`GET /v1/jobs` as a table a person drives: name search, sorting with cursor pages that
stay correct under every order, the total count; and the events' labels that name what
happened (a user's pause is a pause, not a preemption)."""

from __future__ import annotations

import uuid

import pytest
import yaml
from sqlalchemy import select

from jobs.orchestration.states import transition
from jobs.store import queries as store
from jobs.store.ingest import TRAINER_EVENT
from jobs.store.status import JobStatus
from jobs.store.tables import JobEvent, Project

NAMES = ["beta-run", "Alpha_run", "gamma", "alpha-2", "delta%"]


def _seed(stack, names: list[str], batch: str) -> list[str]:
    """Jobs straight into the store (no validation needed to list them), one per name."""
    with stack.session() as session:
        project = session.scalar(select(Project).where(Project.name == stack.project))
        ids = []
        for priority, name in enumerate(names):
            new = store.NewJob(name=f"{batch}-{name}", spec={}, recipe={}, plan={},
                               resources={}, queue="cpu", priority=priority % 3,
                               labels={"batch": batch})  # fmt: skip
            ids.append(store.create_job(session, project.id, new)[0].id)
        session.commit()
    return ids


def _walk(client, headers, **params) -> tuple[list[str], set[int]]:
    names, counts, cursor = [], set(), None
    for _ in range(20):
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=query, headers=headers).json()
        names += [job["name"] for job in page["data"]]
        counts.add(page["count"])
        if not page["has_more"]:
            return names, counts
        cursor = page["next_cursor"]
    raise AssertionError("pages never ended")


@pytest.mark.parametrize("sort", ["name", "-name", "priority", "-priority", "status", "created_at"])
def test_pages_follow_every_sort_order_and_carry_the_count(client, stack, sort) -> None:
    batch = uuid.uuid4().hex[:8]
    _seed(stack, NAMES, batch)
    headers = stack.headers("read")
    whole = client.get("/v1/jobs", params={"label": f"batch={batch}", "sort": sort, "limit": 200},
                       headers=headers).json()  # fmt: skip
    names, counts = _walk(client, headers, label=f"batch={batch}", sort=sort, limit=2)
    assert names == [job["name"] for job in whole["data"]] and counts == {5}
    if sort.endswith("name"):  # the database's collation orders names: compare its own ends
        assert names[0].endswith(("alpha-2", "Alpha_run") if sort == "name" else "gamma")
    if sort.endswith("priority"):
        priorities = [job["priority"] for job in whole["data"]]
        assert priorities == sorted(priorities, reverse=sort.startswith("-"))


def test_search_matches_the_name_in_any_case_or_an_id_prefix(client, stack) -> None:
    batch = uuid.uuid4().hex[:8]
    ids = _seed(stack, NAMES, batch)
    headers = stack.headers("read")

    def names(q: str) -> list[str]:
        page = client.get("/v1/jobs", params={"q": q, "label": f"batch={batch}", "sort": "name"},
                          headers=headers).json()  # fmt: skip
        assert page["count"] == len(page["data"])
        return [job["name"].removeprefix(f"{batch}-") for job in page["data"]]

    assert names("ALPHA") == ["Alpha_run", "alpha-2"]
    assert names("%") == ["delta%"]  # a LIKE wildcard is searched for, not expanded
    assert names("_run") == ["Alpha_run"]
    assert names(ids[2][:8].upper()) == ["gamma"]
    assert names("nothing-like-it") == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"sort": "size"}, "sort"),
        ({"sort": "--name"}, "sort"),
        ({"q": "a\x00b"}, "q"),
        ({"q": "x" * 201}, "q"),
        ({"sort": "name", "cursor": "WyJjcmVhdGVkX2F0Il0"}, "cursor"),
    ],
)
def test_bad_list_parameters_are_422_with_field_and_fix(client, stack, params, field) -> None:
    answer = client.get("/v1/jobs", params=params, headers=stack.headers("read"))
    assert answer.status_code == 422, answer.text
    error = answer.json()["errors"][0]
    assert field in str(error["loc"]) and error["fix"]


def test_a_cursor_of_another_sort_order_is_422(client, stack) -> None:
    batch = uuid.uuid4().hex[:8]
    _seed(stack, NAMES, batch)
    headers = stack.headers("read")
    page = client.get("/v1/jobs", params={"label": f"batch={batch}", "limit": 2, "sort": "name"},
                      headers=headers).json()  # fmt: skip
    answer = client.get("/v1/jobs", params={"cursor": page["next_cursor"], "sort": "-name"},
                        headers=headers)  # fmt: skip
    assert answer.status_code == 422
    assert "another sort order" in answer.json()["errors"][0]["msg"]


def test_a_pause_is_labelled_a_pause_and_spends_no_failure(client, stack) -> None:
    """The trainer reports a user's pause as `preempted`: the label names the pause."""
    job_id = _seed(stack, ["paused"], uuid.uuid4().hex[:8])[0]
    with stack.session() as session:
        transition(session, job_id, JobStatus.STARTING, reason="claim", lease_owner="w")
        transition(session, job_id, JobStatus.RUNNING, reason="started", attempt=1)
        transition(session, job_id, JobStatus.PAUSING, reason="pause requested", attempt=1)
        session.add(JobEvent(job_id=job_id, attempt=1, kind=TRAINER_EVENT, message="stopped",
                             data={"event": "preempted", "step": 3}))  # fmt: skip
        session.flush()
        transition(session, job_id, JobStatus.PAUSED, reason="paused", attempt=1)
        transition(session, job_id, JobStatus.QUEUED, reason="resume")
        session.commit()
    headers = stack.headers("read")
    events = client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()["data"]
    assert [e["label"] for e in events] == [None, "start", None, "pause", "pause", "pause",
                                            "resume"]  # fmt: skip
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert (job["attempt"], job["failed_attempts"]) == (1, 0)


def test_the_request_is_kept_for_clone_and_edit(client, stack, body) -> None:
    """The YAML text comes back as submitted, comments and all, with the overrides."""
    recipe_yaml = "# my comment\n" + yaml.safe_dump(body["recipe"])
    sent = {**body, "recipe": None, "recipe_yaml": recipe_yaml, "overrides": ["optimizer.lr=0.01"],
            "labels": {"team": "nlp"}}  # fmt: skip
    created = client.post("/v1/jobs", json=sent, headers=stack.headers())
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    answer = client.get(f"/v1/jobs/{job_id[:8]}/request", headers=stack.headers("read"))
    assert answer.status_code == 200, answer.text
    kept = answer.json()
    assert kept["recipe_yaml"] == recipe_yaml and kept["recipe"] is None
    assert (kept["overrides"], kept["labels"], kept["name"]) == (["optimizer.lr=0.01"],
                                                                 {"team": "nlp"}, "tiny")  # fmt: skip
    other = client.get(f"/v1/jobs/{job_id}/request", headers=stack.headers("other"))
    assert other.status_code == 404
