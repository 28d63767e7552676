"""How a job id in a URL names a job: its full id, or a unique prefix of it, always within
the caller's project.

People read job ids off the dashboard and the CLI's tables, which show the first 8
characters; `tuneyard status c5d06642` should find that job. A prefix names a job when it is
at least `MIN_PREFIX_HEX` hexadecimal characters of a job id (dashes as in the id may
follow) and exactly one job of the caller's project starts with it. The search never leaves
the project: another project's job is never found and never makes a prefix ambiguous, so
"not found" answers the same whether another project has such a job or not. A shorter
prefix is a 422 naming the field and the length to give; one that matches several jobs is
a 409 listing their full ids.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import ApiError, InvalidRequest, not_found
from jobs.recipe.errors import FieldError
from jobs.store import queries as store
from jobs.store.tables import Job

MIN_PREFIX_HEX = 8
# Candidates listed in an ambiguity answer; more means the prefix is far too short.
MAX_CANDIDATES = 10
# A stored id is a lower-case UUID: hex digits with dashes at these positions.
_ID_LENGTH, _DASHES, _HEX = 36, frozenset({8, 13, 18, 23}), frozenset("0123456789abcdef")


def _is_id_prefix(text: str) -> bool:
    """Whether `text` could begin a stored job id (dashes where the id has them)."""
    return len(text) <= _ID_LENGTH and all(
        (char == "-") if i in _DASHES else (char in _HEX) for i, char in enumerate(text)
    )


def resolve_job_id(session: Session, project_id: int, given: str) -> str:
    """The stored id of the caller's job that `given` names (full id or unique prefix).

    404 when no job of this project matches (also for text that is no id prefix at all),
    422 for a prefix shorter than `MIN_PREFIX_HEX` hex digits, 409 with `candidates` when
    several jobs of this project match."""
    if store.is_job_id(given):
        found = store.job_id_in_project(session, project_id, given)
        if found is None:
            raise not_found("job", given)
        return found
    prefix = given.lower()
    if not _is_id_prefix(prefix):
        raise not_found("job", given)
    if len(prefix.replace("-", "")) < MIN_PREFIX_HEX:
        raise InvalidRequest(
            [
                FieldError(
                    "job_id",
                    f"'{prefix}' is too short to name a job",
                    f"give the full job id or at least its first {MIN_PREFIX_HEX} characters",
                )
            ]
        )
    stmt = (
        select(Job.id)
        .where(Job.project_id == project_id, Job.id.startswith(prefix, autoescape=True))
        .order_by(Job.id)
        .limit(MAX_CANDIDATES + 1)
    )
    matches = list(session.scalars(stmt))
    if not matches:
        raise not_found("job", given)
    if len(matches) > 1:
        shown = matches[:MAX_CANDIDATES]
        more = " (and more)" if len(matches) > MAX_CANDIDATES else ""
        raise ApiError(
            409,
            "ambiguous_job_id",
            f"job id prefix '{prefix}' matches {len(shown)}{more} jobs of this project; "
            "give more characters of the id (or the full id)",
            candidates=shown,
        )
    return matches[0]
