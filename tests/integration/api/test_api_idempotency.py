"""Idempotency-Key: replays return the same job; another body is 409; races create one job."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from sqlalchemy import func, select

from jobs.store.tables import Job


def test_same_key_and_body_returns_the_same_job(client, stack, body) -> None:
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    again = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert again.json()["idempotency_key"] == key["Idempotency-Key"]


def test_same_key_other_body_is_409(client, stack, body) -> None:
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    body["priority"] = 5
    other = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    assert other.status_code == 409
    error = other.json()["error"]
    assert error["code"] == "idempotency_conflict" and error["job_id"] == first.json()["id"]


def test_a_replay_answers_the_stored_job_before_validating_again(client, stack, body, data_root):
    """The data a job was accepted with moved away: a new submit is refused, the retry is not."""
    import shutil

    moved = data_root / f"squad-{uuid.uuid4().hex[:6]}"
    shutil.copytree(data_root / "squad", moved)
    body["recipe"]["dataset"]["path_or_dataset"] = str(moved)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    assert first.status_code == 201, first.text
    shutil.rmtree(moved)
    fresh = client.post("/v1/jobs", json=body, headers=stack.headers())
    assert (
        fresh.status_code == 422 and fresh.json()["errors"][0]["loc"] == "dataset.path_or_dataset"
    )
    again = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    body["priority"] = 9  # a changed body under the same key is still a conflict, not a 422
    assert client.post("/v1/jobs", json=body, headers={**stack.headers(), **key}).status_code == 409


def test_keys_are_per_project(client, stack, body) -> None:
    key = {"Idempotency-Key": uuid.uuid4().hex}
    mine = client.post("/v1/jobs", json=body, headers={**stack.headers(), **key})
    theirs = client.post("/v1/jobs", json=body, headers={**stack.headers("other"), **key})
    assert theirs.status_code == 201 and theirs.json()["id"] != mine.json()["id"]


async def _race(app, headers: dict[str, str], body: dict, keys: list[str]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as c:
        return await asyncio.gather(*(
            c.post("/v1/jobs", json=body, headers={**headers, "Idempotency-Key": k}) for k in keys
        ))  # fmt: skip


@pytest.mark.parametrize("stack", ["postgresql", "sqlite"], indirect=True)
def test_100_concurrent_posts_with_20_keys_create_20_jobs(stack, body) -> None:
    batch = uuid.uuid4().hex[:8]
    keys = [f"{batch}-{i % 20}" for i in range(100)]
    answers = asyncio.run(_race(stack.app, stack.headers(), body, keys))
    assert sorted({a.status_code for a in answers}) == [200, 201], [a.text for a in answers[:3]]
    assert sum(a.status_code == 201 for a in answers) == 20
    by_key: dict[str, set[str]] = {}
    for key, answer in zip(keys, answers, strict=True):
        by_key.setdefault(key, set()).add(answer.json()["id"])
    assert all(len(ids) == 1 for ids in by_key.values())
    with stack.session() as s:
        stored = s.scalar(select(func.count()).where(Job.idempotency_key.like(f"{batch}-%")))
    assert stored == 20
