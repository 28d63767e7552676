"""API keys: creation, hashing and verification. Only a SHA-256 hash of a key is stored.

A key looks like `ty_<43 url-safe chars>` (256 random bits), so a fast hash is enough: there
is nothing to brute-force. The first characters (`prefix`) are kept in clear to tell keys
apart in listings. Roles: `read` (GET only), `submit` (read + submit and control jobs),
`admin` (submit + create keys for its project).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.recipe.errors import did_you_mean
from jobs.store.tables import API_KEY_ROLES, ApiKey, Project, utcnow

KEY_PREFIX = "ty_"
ROLE_RANK = {"read": 0, "submit": 1, "admin": 2}
DEFAULT_PROJECT = "default"
# A new project's name: lower case, so no two projects differ only in case (they would share
# a directory on a case-insensitive filesystem), and one plain path component, so every
# project has its own `projects/<name>/` in each checkpoint root. Projects created earlier
# keep their names.
PROJECT_NAME = re.compile(r"\A[a-z0-9][a-z0-9._-]{0,62}\Z")


@dataclass(frozen=True)
class Principal:
    """Who is calling: a project and a role (from a key, or the auth-off default)."""

    project_id: int
    project_name: str
    role: str
    key_id: int | None = None
    allow_remote_code: bool = False  # the project's grant, read with the key

    def can(self, role: str) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def check_role(role: str) -> None:
    """Refuse an unknown role with a ValueError naming the fix."""
    if role not in API_KEY_ROLES:
        hint = did_you_mean(role, API_KEY_ROLES) or f"use one of {', '.join(API_KEY_ROLES)}"
        raise ValueError(f"role: unknown role '{role}'; {hint}")


def check_project_name(name: str) -> None:
    """Refuse a name a new project may not have, with a ValueError naming the fix."""
    if not PROJECT_NAME.match(name):
        raise ValueError(
            f"project: {name[:80]!r} is not a project name; use 1-63 lower-case letters, "
            "digits, '.', '_' or '-', starting with a letter or digit (e.g. team-a)"
        )


def get_or_create_project(session: Session, name: str) -> Project:
    """The project called `name`, created if missing (safe against a concurrent create);
    a new project's name must pass `check_project_name`."""
    project = session.scalar(select(Project).where(Project.name == name))
    if project is not None:
        return project
    check_project_name(name)
    try:
        with session.begin_nested():
            project = Project(name=name)
            session.add(project)
    except IntegrityError:
        project = session.scalar(select(Project).where(Project.name == name))
    assert project is not None
    return project


def create_api_key(session: Session, project_name: str, role: str) -> tuple[ApiKey, str]:
    """Create a key for `project_name` (created if needed); returns the row and the raw key.

    The raw key is shown once: only its hash is stored. The caller commits.
    """
    check_role(role)
    project = get_or_create_project(session, project_name)
    raw = generate_key()
    key = ApiKey(project_id=project.id, role=role, key_hash=hash_key(raw), prefix=raw[:10])
    session.add(key)
    session.flush()
    return key, raw


# Built once, the key as a bound parameter: every request runs it, and building it per call
# (construction, then its cache key) was a third of the lookup's Python calls.
_KEY_LOOKUP = (
    select(
        ApiKey.id,
        ApiKey.role,
        ApiKey.revoked_at,
        Project.id,
        Project.name,
        Project.allow_remote_code,
    )
    .join(Project, Project.id == ApiKey.project_id)
    .where(ApiKey.key_hash == bindparam("key_hash"))
)


def verify_key(session: Session, raw_key: str) -> Principal | None:
    """The principal for a presented key, or None if unknown or revoked."""
    if not raw_key.startswith(KEY_PREFIX):
        return None
    row = session.execute(_KEY_LOOKUP, {"key_hash": hash_key(raw_key)}).first()
    if row is None:
        return None
    key_id, role, revoked_at, project_id, project_name, allow_remote_code = row
    if revoked_at is not None:
        return None
    return Principal(project_id, project_name, role, key_id, bool(allow_remote_code))


def revoke_api_key(session: Session, key_id: int) -> bool:
    key = session.get(ApiKey, key_id)
    if key is None or key.revoked_at is not None:
        return False
    key.revoked_at = utcnow()
    return True


def default_principal(session: Session) -> Principal:
    """The caller when TUNEYARD_AUTH=off: admin of the `default` project."""
    project = get_or_create_project(session, DEFAULT_PROJECT)
    return Principal(project.id, project.name, "admin", None, bool(project.allow_remote_code))


def set_remote_code(session: Session, project_id: int, allowed: bool) -> Project:
    """Record the project's remote-code grant; the caller commits."""
    project = session.get(Project, project_id)
    assert project is not None
    project.allow_remote_code = allowed
    session.flush()
    return project


def remote_code_granted(session: Session, project_id: int) -> bool:
    """The project's remote-code grant as it stands now (a worker asks at every claim)."""
    query = select(Project.allow_remote_code).where(Project.id == project_id)
    return bool(session.scalar(query))
