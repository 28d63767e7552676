"""A project's remote-code grant withdrawn after a submit: the worker's claim fails the job
before any process of it starts, at its first attempt and when it is resumed. Real API
(TestClient), PostgreSQL, Redis DB 2 and `tuneyard worker` processes (stand-in trainer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_harness import SETTLED, events_of, job_row, tiny_recipe, train_steps, wait_for


@pytest.fixture()
def client(ty_env: dict[str, str]) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from api.main import create_app
    from jobs.store.settings import get_settings

    with TestClient(create_app(get_settings())) as test_client:
        yield test_client


@pytest.fixture()
def body(tiny_assets: dict[str, Path]) -> dict[str, Any]:
    recipe = tiny_recipe(tiny_assets, max_steps=4)
    recipe["model"]["trust_remote_code"] = True
    return {"name": "remote-code", "recipe": recipe,
            "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}}  # fmt: skip


def _grant(client: Any, allowed: bool) -> None:
    answer = client.patch("/v1/projects/default", json={"allow_remote_code": allowed})
    assert answer.status_code == 200 and answer.json()["allow_remote_code"] is allowed


def _submit(client: Any, body: dict[str, Any]) -> str:
    created = client.post("/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["plan"]["trust_remote_code"] is True
    return created.json()["id"]


def _settled(job_id: str) -> Any:
    row = job_row(job_id)
    return row if row.status in SETTLED else None


def _assert_failed_before_start(job_id: str, runs_dir: str, procs: Any) -> None:
    row = wait_for(lambda: _settled(job_id), 60, "the job to settle", procs)
    assert (row.status, row.error_code) == ("failed", "grant_revoked"), procs.logs()
    assert row.error_message.startswith("model.trust_remote_code: ")
    assert "revoked after submission" in row.error_message
    assert "grant it again" in row.error_message and "resubmit" in row.error_message
    last = events_of(job_id)[-1]
    assert (last.to_status, last.data["code"]) == ("failed", "grant_revoked")
    assert "model.trust_remote_code" in last.message
    # The trainer never started: no trainer event, no metric, nothing in a run directory.
    assert not [e for e in events_of(job_id) if e.kind == "trainer"]
    assert train_steps(job_id) == []
    assert not (Path(runs_dir) / job_id / "recipe.json").exists()


def test_a_grant_revoked_while_queued_fails_the_job_at_its_claim(client, body, procs, ty_env):
    _grant(client, True)
    job_id = _submit(client, body)
    _grant(client, False)
    procs.worker("w1")
    _assert_failed_before_start(job_id, ty_env["TUNEYARD_RUNS_DIR"], procs)
    assert job_row(job_id).attempt == 0


def test_a_resumed_job_asks_for_the_grant_again(client, body, procs, ty_env):
    _grant(client, True)
    held, runs = _submit(client, body), _submit(client, body)
    assert client.post(f"/v1/jobs/{held}/pause").json()["status"] == "paused"
    procs.worker("w1")
    ran = wait_for(lambda: _settled(runs), 60, "the granted job to finish", procs)
    assert ran.status == "succeeded", (ran.error_code, ran.error_message, procs.logs())
    assert train_steps(runs)  # with the grant in place the claim went on to train
    _grant(client, False)
    assert client.post(f"/v1/jobs/{held}/resume").json()["status"] == "queued"
    _assert_failed_before_start(held, ty_env["TUNEYARD_RUNS_DIR"], procs)
