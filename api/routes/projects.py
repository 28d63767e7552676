"""The caller's project: reading it, and the admin's remote-code grant.

`PATCH /v1/projects/{name}` with `{"allow_remote_code": true}` lets the project's recipes
set `model.trust_remote_code: true` (the model directory's own Python then runs on the
workers). Only an admin key of that project may change it; every job records in its plan
whether it ran with remote code. Another project's name is simply not found.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter

from api.deps import Admin, Reader, SessionDep
from api.errors import not_found
from api.limits import BoundedJsonRoute
from api.routes.jobs import AUTH_ERRORS, INVALID, NOT_FOUND
from api.schemas import ProjectPublic, ProjectUpdate
from jobs.store.api_keys import Principal, set_remote_code
from jobs.store.tables import Project

router = APIRouter(prefix="/v1", tags=["projects"], route_class=BoundedJsonRoute)
log = logging.getLogger("tuneyard.api")


def _own_project(name: str, principal: Principal, session: SessionDep) -> Project:
    project = session.get(Project, principal.project_id)
    if project is None or project.name != name:
        raise not_found("project", name)
    return project


def _public(project: Project) -> ProjectPublic:
    return ProjectPublic(
        name=project.name,
        allow_remote_code=project.allow_remote_code,
        created_at=project.created_at,
    )


@router.get(
    "/projects/{name}",
    response_model=ProjectPublic,
    summary="The caller's project",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def get_project(name: str, principal: Reader, session: SessionDep) -> ProjectPublic:
    return _public(_own_project(name, principal, session))


@router.patch(
    "/projects/{name}",
    response_model=ProjectPublic,
    summary="Change the project's settings (admin): the remote-code grant",
    responses={**NOT_FOUND, **INVALID, **AUTH_ERRORS},
)
def update_project(
    name: str, body: ProjectUpdate, principal: Admin, session: SessionDep
) -> ProjectPublic:
    project = _own_project(name, principal, session)
    set_remote_code(session, project.id, body.allow_remote_code)
    session.commit()
    log.warning(
        "project %s: allow_remote_code=%s (key %s)", name, body.allow_remote_code, principal.key_id
    )
    return _public(project)
