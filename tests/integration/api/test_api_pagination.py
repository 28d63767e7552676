"""One page shape everywhere: `data`, `has_more`, `next_cursor`, and `cursor` taken back."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert

from jobs.store.tables import JobEvent, JobLog, Metric


def _job(client, stack, body) -> str:
    return client.post("/v1/jobs", json=body, headers=stack.headers()).json()["id"]


def _walk(client, url: str, headers: dict, key: str, **params) -> list:
    """Follow next_cursor until has_more is false; returns every item's `key`."""
    seen, cursor = [], None
    for _ in range(50):
        page = client.get(url, params={**params, **({"cursor": cursor} if cursor else {})},
                          headers=headers).json()  # fmt: skip
        assert {"data", "has_more", "next_cursor"} <= set(page), page
        seen += [item[key] for item in page["data"]]
        if not page["has_more"]:
            return seen
        cursor = page["next_cursor"]
    raise AssertionError("pages never ended")


def test_every_list_pages_with_one_cursor(client, stack, body) -> None:
    job_id = _job(client, stack, body)
    with stack.session() as s:
        s.execute(insert(JobEvent), [{"job_id": job_id, "kind": "note", "message": f"e{i}",
                                      "data": {}} for i in range(6)])  # fmt: skip
        s.execute(insert(JobLog), [{"job_id": job_id, "text": f"line {i}", "seq": i}
                                   for i in range(7)])  # fmt: skip
        s.execute(insert(Metric), [{"job_id": job_id, "kind": "train", "step": i, "loss": 1.0}
                                   for i in range(1, 10)])  # fmt: skip
        s.commit()
    headers = stack.headers("read")
    events = _walk(client, f"/v1/jobs/{job_id}/events", headers, "message", limit=2)
    assert events == ["job submitted", *(f"e{i}" for i in range(6))]
    lines = _walk(client, f"/v1/jobs/{job_id}/logs", headers, "text", limit=3)
    assert lines == [f"line {i}" for i in range(7)]
    steps = _walk(client, f"/v1/jobs/{job_id}/metrics", headers, "step", limit=4)
    assert steps == list(range(1, 10))
    batch = uuid.uuid4().hex[:8]  # the project holds other tests' jobs too
    ids = [client.post("/v1/jobs", json={**body, "labels": {"batch": batch}},
                       headers=stack.headers()).json()["id"] for _ in range(3)]  # fmt: skip
    jobs = _walk(client, "/v1/jobs", headers, "id", limit=1, label=f"batch={batch}")
    assert jobs == ids[::-1]


@pytest.mark.parametrize("suffix", ["/events", "/logs", "/metrics"])
@pytest.mark.parametrize("cursor", ["-1", "x1", "\u00b2", str(2**63)])
def test_a_forged_cursor_is_422(client, stack, body, suffix, cursor) -> None:
    job_id = _job(client, stack, body)
    answer = client.get(f"/v1/jobs/{job_id}{suffix}", params={"cursor": cursor},
                        headers=stack.headers("read"))  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["loc"] == "cursor"
