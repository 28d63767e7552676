"""`restore_from.path` naming a checkpoint in the artifact store: checked at submit from the
text alone (store configured, inside it, the shape of a stored checkpoint, the caller's own
project and job), and the one key layout the worker and the API share."""

from __future__ import annotations

import copy
import uuid

import pytest
from recipe_asserts import error_at

from jobs.recipe.paths.scope import JobScope
from jobs.recipe.paths.stored import (
    StoreLocation,
    artifact_key,
    parse_checkpoint_key,
    parse_store,
    project_key,
)
from jobs.recipe.validation import validate_job

OURS, THEIRS = str(uuid.uuid4()), str(uuid.uuid4())
STORE = "s3://bucket-1/team/tuneyard"


def _url(project: str, job: str, name: str = "step_5") -> str:
    return f"{STORE}/projects/{project}/jobs/{job}/checkpoints/{name}"


@pytest.fixture
def store_settings(settings):
    return settings.model_copy(update={"artifact_store": STORE})


def _validate(settings, recipe, path, scope=None):
    recipe = {**copy.deepcopy(recipe), "restore_from": {"path": path}}
    scope = scope or JobScope(project="alpha", owns_job=lambda job: job == OURS)
    return validate_job(recipe, settings=settings, scope=scope)


def test_a_stored_checkpoint_of_the_projects_own_job_validates(store_settings, recipe) -> None:
    result = _validate(store_settings, recipe, _url("alpha", OURS))
    assert result.valid, result.errors
    assert result.recipe["restore_from"] == {"path": _url("alpha", OURS)}


@pytest.mark.parametrize(
    "path",
    [_url("beta", THEIRS), _url("beta", OURS), _url("alpha", THEIRS)],
    ids=["other-project", "other-project-our-id", "our-project-their-job"],
)
def test_another_projects_checkpoint_is_refused_naming_the_field(store_settings, recipe, path):
    result = _validate(store_settings, recipe, path)
    error = error_at(result, "restore_from.path")
    assert "is not a stored checkpoint of project alpha" in error.msg


@pytest.mark.parametrize(
    "path, says",
    [
        ("s3://other-bucket/team/tuneyard/x", "is not in the artifact store"),
        ("s3://bucket-1/team/elsewhere/x", "is not in the artifact store"),
        (f"{STORE}/projects/alpha/jobs/{OURS}/checkpoints/LATEST", "does not name a stored"),
        (f"{STORE}/projects/alpha/jobs/{OURS}/exports/step_5", "does not name a stored"),
        (f"{STORE}/projects/alpha/jobs/not-an-id/checkpoints/step_5", "does not name a stored"),
        (f"{STORE}/projects/alpha/jobs/{OURS}/checkpoints/step_5/x", "does not name a stored"),
    ],
)
def test_what_is_not_a_stored_checkpoint_is_refused(store_settings, recipe, path, says) -> None:
    error = error_at(_validate(store_settings, recipe, path), "restore_from.path")
    assert says in error.msg and "tuneyard artifacts" in error.fix


def test_without_a_store_an_s3_path_is_refused(settings, recipe) -> None:
    error = error_at(_validate(settings, recipe, _url("alpha", OURS)), "restore_from.path")
    assert "none is configured" in error.msg and "TUNEYARD_ARTIFACT_STORE" in error.fix


def test_parse_store() -> None:
    assert parse_store("s3://b-1/a/b/") == StoreLocation("b-1", "a/b")
    assert parse_store("s3://b-1") == StoreLocation("b-1", "")
    for bad in ("http://b/x", "s3://B/x", "s3://b", "s3://b-1/a/../x", "s3://b-1/a//b"):
        with pytest.raises(ValueError):
            parse_store(bad)


def test_the_key_layout_round_trips() -> None:
    store = parse_store(STORE)
    key = artifact_key(store, "alpha", OURS, "checkpoint", "step_7")
    assert key == f"team/tuneyard/projects/alpha/jobs/{OURS}/checkpoints/step_7"
    found = parse_checkpoint_key(store, key)
    assert (found.project_key, found.job_id, found.step) == ("alpha", OURS, 7)
    assert store.key_of(store.url(key)) == key
    bare = parse_store("s3://bucket-1")
    assert parse_checkpoint_key(bare, artifact_key(bare, "a", OURS, "checkpoint", "step_1"))


def test_a_project_name_that_is_no_path_segment_gets_one_no_plain_name_has() -> None:
    assert project_key("alpha.team-1") == "alpha.team-1"
    assert project_key("../x") == "~..%2Fx"
    assert project_key("a b") == "~a%20b"
    assert len({project_key(n) for n in ("~a", "%7Ea", "a")}) == 3
