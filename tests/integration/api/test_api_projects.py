"""The project's remote-code grant: only its admin changes it, and it decides whether a
recipe may set `model.trust_remote_code: true`; each job's plan records the answer."""

from __future__ import annotations

import copy

import pytest


@pytest.fixture
def remote_code_body(body):
    body = copy.deepcopy(body)
    body["recipe"]["model"]["trust_remote_code"] = True
    return body


def grant(client, stack, allowed: bool, role: str = "admin"):
    return client.patch(f"/v1/projects/{stack.project}", json={"allow_remote_code": allowed},
                        headers=stack.headers(role))  # fmt: skip


def test_remote_code_is_refused_until_an_admin_grants_it(client, stack, remote_code_body):
    try:
        refused = client.post("/v1/jobs", json=remote_code_body, headers=stack.headers())
        assert refused.status_code == 422
        [error] = refused.json()["errors"]
        assert error["loc"] == "model.trust_remote_code" and "PATCH /v1/projects" in error["fix"]
        answer = grant(client, stack, True)
        assert answer.status_code == 200 and answer.json()["allow_remote_code"] is True
        stored = client.post("/v1/jobs", json=remote_code_body, headers=stack.headers())
        assert stored.status_code == 201, stored.text
        assert stored.json()["plan"]["trust_remote_code"] is True
    finally:
        grant(client, stack, False)
    again = client.post("/v1/jobs:validate", json=remote_code_body, headers=stack.headers())
    assert again.status_code == 422


def test_a_grant_withdrawn_after_a_submit_refuses_the_next(client, stack, remote_code_body):
    """The submit key's principal is kept with the grant it was read with; the insert
    checks that grant, so once the admin withdraws it the recipe is validated again, and
    refused, and nothing is stored."""
    try:
        assert grant(client, stack, True).status_code == 200
        kept = client.post("/v1/jobs", json=remote_code_body, headers=stack.headers())
        assert kept.status_code == 201, kept.text
        assert grant(client, stack, False).status_code == 200
        listed = client.get("/v1/jobs", headers=stack.headers()).json()["data"]
        refused = client.post("/v1/jobs", json=remote_code_body, headers=stack.headers())
        assert refused.status_code == 422, refused.text
        assert [e["loc"] for e in refused.json()["errors"]] == ["model.trust_remote_code"]
        assert client.get("/v1/jobs", headers=stack.headers()).json()["data"] == listed
    finally:
        grant(client, stack, False)


def test_jobs_without_remote_code_record_false(client, stack, body):
    stored = client.post("/v1/jobs", json=body, headers=stack.headers())
    assert stored.status_code == 201 and stored.json()["plan"]["trust_remote_code"] is False


def test_only_the_projects_admin_may_change_the_grant(client, stack):
    assert grant(client, stack, True, role="submit").status_code == 403
    other = client.patch(f"/v1/projects/{stack.project}", json={"allow_remote_code": True},
                         headers=stack.headers("other"))  # fmt: skip
    assert other.status_code == 404  # another project's admin does not see it
    assert (
        client.get(f"/v1/projects/{stack.project}", headers=stack.headers("read")).json()[
            "allow_remote_code"
        ]
        is False
    )


def test_a_bad_update_is_a_field_error(client, stack):
    answer = client.patch(f"/v1/projects/{stack.project}", json={"allow_remote_code": "maybe"},
                          headers=stack.headers("admin"))  # fmt: skip
    assert answer.status_code == 422 and answer.json()["errors"][0]["loc"] == "allow_remote_code"
    extra = client.patch(f"/v1/projects/{stack.project}", json={"owner": "me"},
                         headers=stack.headers("admin"))  # fmt: skip
    assert extra.status_code == 422


def retention(client, stack, policy, role: str = "admin"):
    return client.patch(f"/v1/projects/{stack.project}", json={"checkpoint_retention": policy},
                        headers=stack.headers(role))  # fmt: skip


def test_the_admin_sets_and_removes_the_checkpoint_retention_policy(client, stack):
    try:
        answer = retention(client, stack, {"max_bytes": 10**12, "max_age_days": 30})
        assert answer.status_code == 200, answer.text
        assert answer.json()["checkpoint_retention"] == {"max_bytes": 10**12, "max_age_days": 30}
        assert answer.json()["allow_remote_code"] is False  # left out: unchanged
        seen = client.get(f"/v1/projects/{stack.project}", headers=stack.headers("read")).json()
        assert seen["checkpoint_retention"] == {"max_bytes": 10**12, "max_age_days": 30}
        only_age = retention(client, stack, {"max_age_days": 7}).json()["checkpoint_retention"]
        assert only_age == {"max_bytes": None, "max_age_days": 7}
        granted = grant(client, stack, True).json()  # a grant alone keeps the policy
        assert granted["checkpoint_retention"] == only_age
    finally:
        grant(client, stack, False)
        removed = retention(client, stack, None)
    assert removed.status_code == 200 and removed.json()["checkpoint_retention"] is None


def test_only_the_admin_sets_a_retention_policy(client, stack):
    for role in ("submit", "read"):
        assert retention(client, stack, {"max_bytes": 1}, role=role).status_code == 403
    other = retention(client, stack, {"max_bytes": 1}, role="other")
    assert other.status_code == 404


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, "body"),
        ({"checkpoint_retention": {}}, "checkpoint_retention"),
        ({"checkpoint_retention": {"max_bytes": 0}}, "checkpoint_retention.max_bytes"),
        ({"checkpoint_retention": {"max_bytes": 2**70}}, "checkpoint_retention.max_bytes"),
        ({"checkpoint_retention": {"max_age_days": "old"}}, "checkpoint_retention.max_age_days"),
        ({"checkpoint_retention": {"max_age": 3}}, "checkpoint_retention.max_age"),
        ({"allow_remote_code": None}, "allow_remote_code"),
    ],
    ids=["empty", "no-bound", "zero", "huge", "text", "unknown", "null-grant"],
)
def test_a_bad_retention_policy_is_a_field_error_with_a_fix(client, stack, body, loc):
    answer = client.patch(f"/v1/projects/{stack.project}", json=body,
                          headers=stack.headers("admin"))  # fmt: skip
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["loc"] == loc and error["fix"], error
