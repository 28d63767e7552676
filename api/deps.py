"""Request dependencies: settings, a database session, the capacity cache, and the caller.

`SessionDep` is one session per request, closed as soon as the route function returns
(FastAPI's `scope="function"`), before the answer is serialised: a finished route holds no
pooled connection (and on SQLite no write lock) while its response waits for a thread.
`CurrentPrincipal` resolves `Authorization: Bearer <key>` to a project and role on every
request (401 when missing, unknown or revoked); with `TUNEYARD_AUTH=off` every caller is
admin of the `default` project. `require(role)` turns a too-weak role into a 403.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiError
from jobs.store.api_keys import Principal, default_principal, verify_key
from jobs.store.capacity import CapacityCache
from jobs.store.settings import Settings

bearer = HTTPBearer(auto_error=False, description="An API key from `tuneyard keys create`.")


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


async def get_capacity(request: Request) -> CapacityCache:
    return request.app.state.capacity


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request, for at most `api_threads` requests at once; the others wait
    for a slot in order, on the event loop, holding no thread.

    FastAPI closes a function-scoped dependency after the route's answer is validated, which
    for a sync route takes a thread: a request still in its transaction (on SQLite every
    transaction holds the write lock) must never wait for a thread that only requests
    waiting on it could free. With no more sessions than threads, one is always free to it.
    Closed on the event loop for the same reason."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    async with request.app.state.session_slots:
        session = factory()
        try:
            yield session
        finally:
            session.close()


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
CapacityDep = Annotated[CapacityCache, Depends(get_capacity)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def get_principal(settings: SettingsDep, session: SessionDep, creds: Credentials) -> Principal:
    """The caller (401 for a missing, unknown or revoked key), looked up on every request.

    The lookup opens the request's transaction, and the route goes on in it (one pooled
    connection a request)."""
    if not settings.auth_enabled:
        principal = default_principal(session)
        session.commit()  # it may have created the default project
        return principal
    if creds is None or creds.scheme.lower() != "bearer":
        raise ApiError(401, "unauthorized", "send `Authorization: Bearer <api key>`")
    principal = verify_key(session, creds.credentials)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def require(role: str) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that lets through principals with at least `role`."""

    async def check(principal: CurrentPrincipal) -> Principal:
        if not principal.can(role):
            raise ApiError(
                403,
                "forbidden",
                f"this key's role '{principal.role}' cannot do this; it needs '{role}' or higher",
            )
        return principal

    return check


Reader = Annotated[Principal, Depends(require("read"))]
Submitter = Annotated[Principal, Depends(require("submit"))]
Admin = Annotated[Principal, Depends(require("admin"))]
