"""Metrics (cursor, downsampling), the SSE stream, logs and checkpoints of a job."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import insert

from jobs.orchestration.states import transition
from jobs.store.tables import Checkpoint, JobLog, Metric


def new_job(client, stack, body) -> str:
    return client.post("/v1/jobs", json=body, headers=stack.headers()).json()["id"]


def add_metrics(stack, job_id: str, steps: range, kind: str = "train") -> None:
    rows = [{"job_id": job_id, "attempt": 1, "kind": kind, "step": s, "epoch": 0,
             "loss": 2 + math.sin(s / 7.0) if kind == "train" else None,
             "val_loss": 1.5 if kind == "val" else None, "lr": 1e-3, "timestamp": float(s)}
            for s in steps]  # fmt: skip
    with stack.session() as s:
        s.execute(insert(Metric), rows)
        s.commit()


def finish(stack, job_id: str) -> None:
    with stack.session() as s:
        transition(s, job_id, "starting", reason="test", lease_owner="w")
        transition(s, job_id, "running", reason="test")
        transition(s, job_id, "succeeded", reason="test")
        s.commit()


def test_metrics_ascending_with_cursor(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    add_metrics(stack, job_id, range(1, 51))
    add_metrics(stack, job_id, range(10, 51, 10), "val")
    url, headers = f"/v1/jobs/{job_id}/metrics", stack.headers("read")
    page = client.get(url, params={"limit": 20}, headers=headers).json()
    assert [r["step"] for r in page["data"]] == list(range(1, 21))
    assert page["next_after_step"] == 20 and page["downsampled"] is False
    rest = client.get(url, params={"after_step": 20}, headers=headers).json()
    assert [r["step"] for r in rest["data"]] == list(range(21, 51))
    empty = client.get(url, params={"after_step": 50}, headers=headers).json()
    assert empty["data"] == [] and empty["next_after_step"] == 50
    val = client.get(url, params={"kind": "val"}, headers=headers).json()
    assert [r["val_loss"] for r in val["data"]] == [1.5] * 5
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    assert job["latest_metrics"]["step"] == 50


def test_max_points_keeps_bucket_extremes_and_the_last_step(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    add_metrics(stack, job_id, range(1, 2001))
    url, headers = f"/v1/jobs/{job_id}/metrics", stack.headers("read")
    page = client.get(url, params={"max_points": 101}, headers=headers).json()
    steps = [r["step"] for r in page["data"]]
    assert page["downsampled"] and len(steps) <= 101 and steps == sorted(steps)
    assert steps[-1] == 2000
    losses = [2 + math.sin(s / 7.0) for s in range(1, 2001)]
    got = {r["step"]: r["loss"] for r in page["data"]}
    assert min(got.values()) == pytest.approx(min(losses))  # the global extremes survive
    assert max(got.values()) == pytest.approx(max(losses))
    # 101 points: 33 buckets of min, max and last. PostgreSQL serves them from rollups of
    # 50 steps (buckets of whole blocks from step 0); SQLite cuts the span itself.
    origin, width = (0, 100) if stack.backend == "postgresql" else (1, math.ceil(2000 / 33))
    for start in range(origin, 2001, width):  # each bucket keeps its min, max and last
        bucket = range(max(1, start), min(2001, start + width))
        low = min(bucket, key=lambda s: (losses[s - 1], s))
        high = min(bucket, key=lambda s: (-losses[s - 1], s))
        assert low in got and high in got and bucket[-1] in got, (start, low, high)
    tail = client.get(url, params={"max_points": 2}, headers=headers).json()
    assert [r["step"] for r in tail["data"]] == [1999, 2000]
    small = client.get(url, params={"max_points": 5000}, headers=headers).json()
    assert not small["downsampled"] and len(small["data"]) == 2000


def test_stream_sends_every_record_then_ends_and_resumes(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    add_metrics(stack, job_id, range(1, 6))
    add_metrics(stack, job_id, [5], "val")
    finish(stack, job_id)
    url, headers = f"/v1/jobs/{job_id}/metrics/stream", stack.headers("read")
    with client.stream("GET", url, headers=headers) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = parse_sse("".join(answer.iter_text()))
    metrics = [e for e in events if e["event"] == "metric"]
    assert [(e["data"]["kind"], e["data"]["step"]) for e in metrics] == [
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("train", 4),
        ("train", 5),
        ("val", 5),
    ]
    assert events[-1]["event"] == "end" and events[-1]["data"]["status"] == "succeeded"
    resume_from = metrics[2]["id"]
    with client.stream("GET", url, headers={**headers, "Last-Event-ID": resume_from}) as answer:
        again = parse_sse("".join(answer.iter_text()))
    assert [e["data"]["step"] for e in again if e["event"] == "metric"] == [4, 5, 5]
    train_only = parse_sse(client.get(url, params={"kind": "train"}, headers=headers).text)
    assert {e["data"]["kind"] for e in train_only if e["event"] == "metric"} == {"train"}


def parse_sse(text: str) -> list[dict]:
    import json

    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if not line.startswith(":")
        )
        if fields:
            events.append({"id": fields.get("id"), "event": fields["event"],
                           "data": json.loads(fields["data"])})  # fmt: skip
    return events


def test_logs_with_cursor_and_follow(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    with stack.session() as s:
        s.execute(insert(JobLog), [{"job_id": job_id, "attempt": 1, "stream": "stdout",
                                    "seq": i, "text": f"line {i}"} for i in range(5)])  # fmt: skip
        s.commit()
    url, headers = f"/v1/jobs/{job_id}/logs", stack.headers("read")
    first = client.get(url, params={"limit": 3}, headers=headers).json()
    assert [line["text"] for line in first["lines"]] == ["line 0", "line 1", "line 2"]
    rest = client.get(url, params={"after": first["next_after"]}, headers=headers).json()
    assert [line["text"] for line in rest["lines"]] == ["line 3", "line 4"]
    finish(stack, job_id)
    followed = parse_sse(client.get(url, params={"follow": True}, headers=headers).text)
    assert [e["data"]["text"] for e in followed if e["event"] == "log"] == [
        f"line {i}" for i in range(5)
    ]
    assert followed[-1]["event"] == "end"


def test_checkpoints_listed_by_step(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    with stack.session() as s:
        for step in (20, 10):
            s.add(Checkpoint(job_id=job_id, attempt=1, step=step, path=f"/runs/step_{step}",
                             size_bytes=1024, metrics={"loss": 1.0 / step}))  # fmt: skip
        s.commit()
    answer = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=stack.headers("read"))
    data = answer.json()["data"]
    assert [c["step"] for c in data] == [10, 20] and data[0]["metrics"] == {"loss": 0.1}
    assert data[1]["path"] == "/runs/step_20" and data[1]["size_bytes"] == 1024


def test_metrics_etag_answers_304_until_the_page_changes(client, stack, body) -> None:
    job_id = new_job(client, stack, body)
    add_metrics(stack, job_id, range(1, 11))
    url, headers = f"/v1/jobs/{job_id}/metrics", stack.headers("read")
    first = client.get(url, params={"after_step": 5}, headers=headers)
    assert first.status_code == 200 and first.headers["etag"].startswith('W/"')
    assert first.json()["has_more"] is False and first.json()["next_after_step"] == 10
    again = client.get(url, params={"after_step": 5},
                       headers={**headers, "If-None-Match": first.headers["etag"]})  # fmt: skip
    assert again.status_code == 304 and again.content == b""
    add_metrics(stack, job_id, range(11, 13))
    changed = client.get(url, params={"after_step": 5},
                         headers={**headers, "If-None-Match": first.headers["etag"]})  # fmt: skip
    assert changed.status_code == 200 and changed.headers["etag"] != first.headers["etag"]
    paged = client.get(url, params={"limit": 4}, headers=headers).json()
    assert paged["has_more"] is True and paged["next_after_step"] == 4


def test_checkpoints_say_why_each_is_kept_and_what_was_deleted(client, stack, body) -> None:
    from jobs.store.retention import record_trainer_deletions

    body = {**body, "recipe": {**body["recipe"]}}
    body["recipe"]["validation_dataset"] = body["recipe"]["dataset"]
    body["recipe"]["step_scheduler"] = {
        **body["recipe"]["step_scheduler"],
        "val_check_interval": 10,
        "checkpoint_interval": 10,
    }
    body["recipe"]["checkpoint"] = {"keep_last": 1, "keep_best": {"metric": "val_loss", "k": 1}}
    submitted = client.post("/v1/jobs", json=body, headers=stack.headers())
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    with stack.session() as s:
        for step, val in ((10, 2.0), (20, 1.0), (30, 1.5), (40, 3.0)):
            s.add(Checkpoint(job_id=job_id, attempt=1, step=step, path=f"/runs/step_{step}",
                             size_bytes=10, metrics={"loss": 1.0, "val_loss": val}))  # fmt: skip
        s.flush()
        gone = {"event": "checkpoint_deleted", "step": 30, "path": "/runs/step_30",
                "reason": "not among the last 1"}  # fmt: skip
        assert record_trainer_deletions(s, job_id, [gone, gone]) == 2  # a replay adds nothing
        s.commit()
    answer = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=stack.headers("read")).json()
    kept = {c["step"]: c["kept_because"] for c in answer["data"]}
    assert kept == {10: [], 20: ["best val_loss #1 of 1"],
                    40: ["latest", "last 1", "resumable: the job resumes from it"]}  # fmt: skip
    [deleted] = answer["deleted"]
    assert deleted["step"] == 30 and deleted["source"] == "trainer"
    assert deleted["reason"] == "not among the last 1" and deleted["size_bytes"] == 10
    assert deleted["deleted_at"] and deleted["path"] == "/runs/step_30"
    other = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=stack.headers("other"))
    assert other.status_code == 404
