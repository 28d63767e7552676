"""API keys: only a hash is stored, roles rank, the default principal, on both backends."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from jobs.store.api_keys import create_api_key, default_principal, hash_key, verify_key
from jobs.store.tables import ApiKey, Project


def test_only_the_hash_is_stored_and_roles_rank(session) -> None:
    project = f"p-{uuid.uuid4().hex[:6]}"
    key, raw = create_api_key(session, project, "submit")
    session.commit()
    stored = session.scalar(select(ApiKey).where(ApiKey.id == key.id))
    assert stored.key_hash == hash_key(raw) and raw not in stored.key_hash
    assert raw.startswith(stored.prefix) and len(raw) > 40
    principal = verify_key(session, raw)
    assert principal.can("read") and principal.can("submit") and not principal.can("admin")
    assert verify_key(session, raw + "x") is None and verify_key(session, "nope") is None
    with pytest.raises(ValueError, match="did you mean 'admin'"):
        create_api_key(session, project, "admn")


def test_default_principal_is_admin_of_default(session) -> None:
    first, second = default_principal(session), default_principal(session)
    assert first.role == "admin" and first.project_name == "default"
    assert first.project_id == second.project_id


@pytest.mark.parametrize(
    "name", ["Team-A", "team/a", "..", "-team", "", "a" * 64, "team a", "t\x1b[31m", "ｔeam"]
)
def test_a_new_project_needs_a_plain_lower_case_name(session, name) -> None:
    """No case-only twins (one directory on a case-insensitive filesystem), and every project
    has a `projects/<name>/` directory of its own in each checkpoint root."""
    with pytest.raises(ValueError, match="is not a project name"):
        create_api_key(session, name, "submit")
    assert session.scalar(select(Project).where(Project.name == name)) is None


def test_a_project_created_earlier_keeps_its_name(session) -> None:
    name = f"Legacy/{uuid.uuid4().hex[:6]}"
    session.add(Project(name=name))
    session.flush()
    key, raw = create_api_key(session, name, "read")
    assert verify_key(session, raw).project_name == name
