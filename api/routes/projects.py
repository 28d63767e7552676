"""The caller's project: reading it, the admin's remote-code grant and retention policy.

`PATCH /v1/projects/{name}` with `{"allow_remote_code": true}` lets the project's recipes
set `model.trust_remote_code: true` (the model directory's own Python then runs on the
workers). Only an admin key of that project may change it; every job records in its plan
whether it ran with remote code. `{"checkpoint_retention": {"max_bytes": ...,
"max_age_days": ...}}` sets the policy for its finished jobs' checkpoints, which the
scheduler applies (`worker.retention`); `null` removes it. Another project's name is simply
not found.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter

from api.deps import Admin, Reader, SessionDep
from api.errors import not_found
from api.limits import BoundedJsonRoute
from api.retention_schemas import CheckpointRetention
from api.routes.jobs import AUTH_ERRORS, INVALID, NOT_FOUND
from api.schemas import ProjectPublic, ProjectUpdate
from jobs.store import retention
from jobs.store.api_keys import Principal, set_remote_code
from jobs.store.tables import Project

router = APIRouter(prefix="/v1", tags=["projects"], route_class=BoundedJsonRoute)
log = logging.getLogger("tuneyard.api")


def _own_project(name: str, principal: Principal, session: SessionDep) -> Project:
    project = session.get(Project, principal.project_id)
    if project is None or project.name != name:
        raise not_found("project", name)
    return project


def _public(project: Project, session: SessionDep) -> ProjectPublic:
    policy = retention.get_policy(session, project.id)
    return ProjectPublic(
        name=project.name,
        allow_remote_code=project.allow_remote_code,
        created_at=project.created_at,
        checkpoint_retention=None
        if policy is None
        else CheckpointRetention(max_bytes=policy.max_bytes, max_age_days=policy.max_age_days),
    )


@router.get(
    "/projects/{name}",
    response_model=ProjectPublic,
    summary="The caller's project",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def get_project(name: str, principal: Reader, session: SessionDep) -> ProjectPublic:
    return _public(_own_project(name, principal, session), session)


@router.patch(
    "/projects/{name}",
    response_model=ProjectPublic,
    summary="Change the project's settings (admin): remote-code grant, checkpoint retention",
    responses={**NOT_FOUND, **INVALID, **AUTH_ERRORS},
)
def update_project(
    name: str, body: ProjectUpdate, principal: Admin, session: SessionDep
) -> ProjectPublic:
    project = _own_project(name, principal, session)
    if body.allow_remote_code is not None:
        set_remote_code(session, project.id, body.allow_remote_code)
        log.warning(
            "project %s: allow_remote_code=%s (key %s)",
            name,
            body.allow_remote_code,
            principal.key_id,
        )
    if "checkpoint_retention" in body.model_fields_set:
        policy = body.checkpoint_retention
        bounds = (policy.max_bytes, policy.max_age_days) if policy else (None, None)
        retention.set_policy(session, project.id, *bounds)
        log.warning("project %s: checkpoint_retention=%s (key %s)", name, policy, principal.key_id)
    session.commit()
    return _public(project, session)
