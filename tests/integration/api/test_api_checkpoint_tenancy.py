"""Checkpoints belong to one project (issue 28), through POST /v1/jobs with two projects.

A job writes and restores only in its own run directory, the runs of its project's jobs, or
`<checkpoint root>/<project>/...`; a relative `checkpoint_dir` stays in the run directory.
Project A is `stack.project` (role `submit`), project B is `stack.project + "-other"` (role
`other`). B's refusal reads the same whether A's directory or step exists or not.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import pytest


def submit(client, stack, body, role="submit"):
    return client.post("/v1/jobs", json=body, headers=stack.headers(role))


def refusal(answer, loc):
    """The whole 422 answer, which must be one error at `loc`."""
    assert answer.status_code == 422, answer.text
    errors = answer.json()["errors"]
    assert [e["loc"] for e in errors] == [loc], errors
    return errors


def publish(directory: Path, step: int) -> Path:
    """A complete checkpoint as the trainer lays it out."""
    found = directory / f"step_{step}"
    found.mkdir(parents=True, exist_ok=True)
    (found / "trainer_state.json").write_text("{}")
    (directory / "LATEST").write_text(f"step_{step}\n")
    return found


@pytest.fixture
def root(stack) -> Path:
    """Where projects keep their checkpoints in the first checkpoint root."""
    return Path(stack.settings.allowed_checkpoint_roots()[0]) / "projects"


@pytest.fixture
def a_dir(stack, root) -> Path:
    """A fresh directory name in project A's subtree (not created)."""
    return root / stack.project / f"shared-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def b_dir(stack, root) -> Path:
    return root / f"{stack.project}-other"


def with_checkpoint_dir(body, value):
    body = copy.deepcopy(body)
    body["recipe"]["checkpoint"] = {"checkpoint_dir": str(value)}
    return body


def with_restore(body, path):
    body = copy.deepcopy(body)
    body["recipe"]["restore_from"] = {"path": str(path)}
    return body


def test_b_cannot_write_in_project_a_whether_the_directory_exists_or_not(
    client, stack, body, a_dir
) -> None:
    theirs = with_checkpoint_dir(body, a_dir)
    before = refusal(submit(client, stack, theirs, "other"), "checkpoint.checkpoint_dir")
    assert submit(client, stack, with_checkpoint_dir(body, a_dir)).status_code == 201
    publish(a_dir, 1)
    after = refusal(submit(client, stack, theirs, "other"), "checkpoint.checkpoint_dir")
    assert before == after
    assert stack.project + "-other" in before[0]["msg"]


def test_b_cannot_restore_from_project_a_whether_the_step_exists_or_not(
    client, stack, body, a_dir
) -> None:
    theirs = with_restore(body, a_dir / "step_1")
    before = refusal(submit(client, stack, theirs, "other"), "restore_from.path")
    publish(a_dir, 1)
    assert submit(client, stack, with_restore(body, a_dir / "step_1")).status_code == 201
    after = refusal(submit(client, stack, theirs, "other"), "restore_from.path")
    assert before == after


def test_b_cannot_reach_project_a_through_dotdot(client, stack, body, a_dir, b_dir) -> None:
    publish(a_dir, 1)
    climbing = f"{b_dir}/../{stack.project}/{a_dir.name}"
    refusal(
        submit(client, stack, with_checkpoint_dir(body, climbing), "other"),
        "checkpoint.checkpoint_dir",
    )
    restore = with_restore(body, f"{climbing}/step_1")
    refusal(submit(client, stack, restore, "other"), "restore_from.path")


def test_b_probing_a_run_of_project_a_gets_one_answer(client, stack, body) -> None:
    answer = submit(client, stack, body)
    assert answer.status_code == 201, answer.text
    checkpoints = stack.settings.resolved_runs_dir / answer.json()["id"] / "checkpoints"
    theirs = with_restore(body, checkpoints / "step_3")
    before = refusal(submit(client, stack, theirs, "other"), "restore_from.path")
    publish(checkpoints, 3)
    after = refusal(submit(client, stack, theirs, "other"), "restore_from.path")
    assert before == after


def test_each_project_uses_its_own_subtree(client, stack, body, b_dir) -> None:
    name = f"x-{uuid.uuid4().hex[:8]}"
    mine = b_dir / name
    answer = submit(client, stack, with_checkpoint_dir(body, mine), "other")
    assert answer.status_code == 201, answer.text
    assert answer.json()["recipe"]["checkpoint"]["checkpoint_dir"] == str(mine)
    publish(mine, 2)
    answer = submit(client, stack, with_restore(body, mine / "step_2"), "other")
    assert answer.status_code == 201, answer.text
    assert answer.json()["recipe"]["restore_from"] == {"path": str(mine / "step_2")}
    theirs = b_dir.parent / stack.project / name  # the same name in A's subtree
    answer = submit(client, stack, with_checkpoint_dir(body, theirs), "other")
    refusal(answer, "checkpoint.checkpoint_dir")


def test_a_relative_checkpoint_dir_stays_in_the_run_directory(client, stack, body) -> None:
    answer = submit(client, stack, with_checkpoint_dir(body, "checkpoints/"))
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["recipe"]["checkpoint"]["checkpoint_dir"] == "checkpoints"
    run = stack.settings.resolved_runs_dir / job["id"]
    publish(run / "checkpoints", 5)
    restore = copy.deepcopy(body)
    restore["recipe"]["restore_from"] = {"job": job["id"]}
    answer = submit(client, stack, restore)
    assert answer.status_code == 201, answer.text
    assert answer.json()["recipe"]["restore_from"] == {"path": str(run / "checkpoints" / "step_5")}


def test_a_relative_checkpoint_dir_cannot_climb_out(client, stack, body) -> None:
    answer = submit(client, stack, with_checkpoint_dir(body, "../x"))
    assert "run directory" in refusal(answer, "checkpoint.checkpoint_dir")[0]["msg"]


def test_a_symlink_from_project_b_into_project_a_is_refused(
    client, stack, body, a_dir, b_dir
) -> None:
    b_dir.mkdir(parents=True, exist_ok=True)
    link = b_dir / f"link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(a_dir, target_is_directory=True)
    restore = with_restore(body, link / "step_1")
    before = refusal(submit(client, stack, restore, "other"), "restore_from.path")
    write = with_checkpoint_dir(body, link)
    written_before = refusal(submit(client, stack, write, "other"), "checkpoint.checkpoint_dir")
    publish(a_dir, 1)
    assert refusal(submit(client, stack, restore, "other"), "restore_from.path") == before
    after = refusal(submit(client, stack, write, "other"), "checkpoint.checkpoint_dir")
    assert after == written_before
