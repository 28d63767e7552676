"""The job a submit answers with: `written_job` (a transient Job without attribute events)
and `job_public_json` (its JSON, without a model), against the ORM and `JobPublic`."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from sqlalchemy import inspect

from api.routes.jobs import job_public, job_public_json
from jobs.store.job_create import written_job
from jobs.store.status import JobStatus
from jobs.store.tables import Job

STAMP = datetime(2026, 12, 2, 17, 4, 5, 6789, tzinfo=UTC)
VALUES = {
    "id": "0b6c5a56-9a55-4e0f-8b65-0d5f1c2c7f10", "project_id": 7, "name": "sft-ü",
    "status": "queued", "spec": {"overrides": ["a.b=1"], "recipe": {}},
    "recipe": {"optimizer": {"lr": 1e-5, "betas": [0.9, 0.999]}, "big": 1e20, "n": -2**63},
    "plan": {"max_steps": 20, "warnings": [{"loc": "x", "msg": "unused", "fix": "drop it"},
                                           {"loc": "y", "msg": "no fix"}]},
    "resources": {"accelerator": "cpu"}, "queue": "cpu", "priority": 2,
    "labels": {"k": "v"}, "attempt": 0, "max_attempts": 3, "idempotency_key": None,
    "request_hash": "ab", "lease_owner": None, "lease_expires_at": None, "error_code": None,
    "error_message": None, "run_dir": None, "dispatched_at": STAMP, "created_at": STAMP,
    "updated_at": STAMP.replace(microsecond=0), "started_at": None, "finished_at": None,
}  # fmt: skip


def test_written_job_reads_as_the_values_and_stays_transient() -> None:
    job = written_job(dict(VALUES))
    assert {c.key: getattr(job, c.key) for c in inspect(Job).column_attrs} == VALUES
    assert inspect(job).transient
    job.dispatched_at = None  # a refused send takes the mark back on the answer
    assert job.dispatched_at is None


@pytest.mark.parametrize("status", [s.value for s in JobStatus])
@pytest.mark.parametrize("changes", [
    {},
    {"plan": {}, "labels": None, "resources": None, "spec": None, "recipe": None},
    {"error_code": "oom", "error_message": "out of memory", "run_dir": "/runs/x",
     "started_at": STAMP, "finished_at": STAMP.replace(tzinfo=None), "attempt": 2,
     "idempotency_key": "ci-42"},
])  # fmt: skip
def test_job_public_json_is_job_public(status: str, changes: dict) -> None:
    job = written_job({**VALUES, **changes, "status": status})
    fast = job_public_json(job, "proj")
    assert orjson.loads(fast) == orjson.loads(job_public(job, "proj").model_dump_json())
