"""Checkpoint and restore paths stay inside the caller's project (issue 11, item 6), and
`restore_from: {job, step}` names a job of the same project, through POST /v1/jobs."""

from __future__ import annotations

import copy

import pytest


def submit(client, stack, body, role="submit"):
    return client.post("/v1/jobs", json=body, headers=stack.headers(role))


@pytest.fixture
def job_a(client, stack, body):
    """A job of project A with two published checkpoints (as the trainer lays them out)."""
    answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    checkpoints = stack.settings.resolved_runs_dir / job_id / "checkpoints"
    for step in (4, 8):
        (checkpoints / f"step_{step}").mkdir(parents=True)
        (checkpoints / f"step_{step}" / "trainer_state.json").write_text("{}")
    (checkpoints / "LATEST").write_text("step_8\n")
    return job_id


def _errors(answer):
    assert answer.status_code == 422, answer.text
    return {e["loc"]: e for e in answer.json()["errors"]}


def test_restore_from_job_and_step(client, stack, body, job_a) -> None:
    body["recipe"]["restore_from"] = {"job": job_a, "step": 4}
    answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    expected = stack.settings.resolved_runs_dir / job_a / "checkpoints" / "step_4"
    assert answer.json()["recipe"]["restore_from"] == {"path": str(expected)}


def test_restore_from_job_without_step_is_its_latest(client, stack, body, job_a) -> None:
    body["recipe"]["restore_from"] = {"job": job_a}
    answer = client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    assert answer.status_code == 200, answer.text
    assert answer.json()["recipe"]["restore_from"]["path"].endswith(f"{job_a}/checkpoints/step_8")


def test_restore_from_a_missing_step(client, stack, body, job_a) -> None:
    body["recipe"]["restore_from"] = {"job": job_a, "step": 6}
    error = _errors(submit(client, stack, body))["restore_from.step"]
    assert "step_4" in error["fix"] and "step_8" in error["fix"]


def test_another_project_cannot_restore_from_the_job(client, stack, body, job_a) -> None:
    body["recipe"]["restore_from"] = {"job": job_a, "step": 4}
    error = _errors(submit(client, stack, body, role="other"))["restore_from.job"]
    assert error["msg"] == f"no job {job_a} in project {stack.project}-other"


def test_an_unknown_job_id(client, stack, body) -> None:
    body["recipe"]["restore_from"] = {"job": "00000000-0000-4000-8000-000000000000"}
    assert "restore_from.job" in _errors(submit(client, stack, body))


def test_another_project_cannot_restore_from_the_path(client, stack, body, job_a) -> None:
    step = stack.settings.resolved_runs_dir / job_a / "checkpoints" / "step_4"
    body["recipe"]["restore_from"] = {"path": str(step)}
    errors = _errors(submit(client, stack, body, role="other"))
    assert "restore_from.path" in errors
    mine = copy.deepcopy(body)
    assert submit(client, stack, mine).status_code == 201


def test_another_project_cannot_write_into_the_run(client, stack, body, job_a) -> None:
    target = stack.settings.resolved_runs_dir / job_a / "checkpoints"
    body["recipe"]["checkpoint"] = {"checkpoint_dir": str(target)}
    assert "checkpoint.checkpoint_dir" in _errors(submit(client, stack, body, role="other"))
    assert submit(client, stack, body).status_code == 201


def test_the_runs_dir_itself_is_nobodys_checkpoint_dir(client, stack, body) -> None:
    body["recipe"]["checkpoint"] = {"checkpoint_dir": str(stack.settings.resolved_runs_dir)}
    assert "checkpoint.checkpoint_dir" in _errors(submit(client, stack, body))


def test_restore_from_a_job_that_moved_its_checkpoints(client, stack, body) -> None:
    own = stack.settings.allowed_checkpoint_roots()[0] / "projects" / stack.project / "moved"
    (own / "step_2").mkdir(parents=True)
    (own / "LATEST").write_text("step_2")
    first = copy.deepcopy(body)
    first["recipe"]["checkpoint"] = {"checkpoint_dir": str(own)}
    answer = submit(client, stack, first)
    assert answer.status_code == 201, answer.text
    body["recipe"]["restore_from"] = {"job": answer.json()["id"]}
    answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["recipe"]["restore_from"]["path"] == str(own / "step_2")
