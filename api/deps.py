"""Request dependencies: settings, a database session, and the calling principal.

`SessionDep` yields one session per request. `CurrentPrincipal` resolves
`Authorization: Bearer <key>` to a project and role (401 when missing or unknown); with
`TUNEYARD_AUTH=off` every caller is admin of the `default` project. `require(role)` turns a
too-weak role into a 403. `ReleasingRoute` hands a route's connection back as soon as the
route returns (and reads JSON bodies with `api.limits`' bounded numbers).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiError
from api.limits import BoundedJsonRoute
from jobs.store.api_keys import KeyGuard, Principal, default_principal, hash_key, verify_key
from jobs.store.capacity import CapacityCache
from jobs.store.settings import Settings

bearer = HTTPBearer(auto_error=False, description="An API key from `tuneyard keys create`.")


# Cheap dependencies are async: FastAPI runs a sync one in the threadpool, one more queue
# a request waits in under load.
async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request, closed on the event loop: a sync teardown would need a
    threadpool slot, and with every slot waiting for a pooled connection the connections
    held by finished requests would never come back."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    session = factory()
    try:
        yield session
    finally:
        session.close()


def _release_sessions(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(endpoint)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return endpoint(*args, **kwargs)
        finally:
            for value in kwargs.values():
                if isinstance(value, Session):
                    value.close()

    return run


class ReleasingRoute(BoundedJsonRoute):
    """Closes the request's session as soon as a sync route returns.

    FastAPI validates a sync route's response in the threadpool; a session still inside its
    transaction would hold a pooled connection (or SQLite's write lock) while it waits for
    a thread, and under load every thread can be waiting for that connection or lock.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint):
            endpoint = _release_sessions(endpoint)
        super().__init__(path, endpoint, **kwargs)


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SessionDep = Annotated[Session, Depends(get_session)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def end_read(session: Session) -> None:
    """End a read transaction where holding it costs something. On SQLite every transaction
    holds the write lock; on PostgreSQL the reads a route makes before its write share the
    write's transaction (the route runs in one threadpool slot, so nothing waits for a
    thread while its connection is held)."""
    if session.get_bind().dialect.name == "sqlite":
        session.commit()


def _verify(session: Session, raw_key: str, shared: bool = False) -> Principal | None:
    """The key's principal. `shared`: the caller does all its work in this one threadpool
    call, so on PostgreSQL the lookup is the first read of the session's own transaction
    (one connection, no extra checkout). Otherwise in no transaction the request keeps: the
    route runs in another threadpool slot, and a connection held while a request waits for
    one could starve the pool; on PostgreSQL one autocommit query (no BEGIN, no COMMIT)."""
    bind = session.get_bind()
    if isinstance(bind, Connection):  # a `read_session`: already one autocommit connection
        return verify_key(session, raw_key)
    if bind.dialect.name == "sqlite":
        principal = verify_key(session, raw_key)
        session.commit()
        return principal
    if shared:
        return verify_key(session, raw_key)
    with bind.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        with Session(bind=conn) as lookup:
            return verify_key(lookup, raw_key)


def _bearer(creds: HTTPAuthorizationCredentials | None) -> HTTPAuthorizationCredentials:
    """The credentials when they are a bearer key, else the 401 that asks for one."""
    if creds is None or creds.scheme.lower() != "bearer":
        raise ApiError(401, "unauthorized", "send `Authorization: Bearer <api key>`")
    return creds


def _principal(
    settings: Settings,
    session: Session,
    creds: HTTPAuthorizationCredentials | None,
    shared: bool = False,
) -> Principal:
    if not settings.auth_enabled:
        bind = session.get_bind()
        if isinstance(bind, Connection):  # autocommit: the create needs its own transaction
            with Session(bind=bind.engine) as own:
                principal = default_principal(own)
                own.commit()  # it may have created the default project
            return principal
        principal = default_principal(session)
        session.commit()  # it may have created the default project
        return principal
    creds = _bearer(creds)
    principal = _verify(session, creds.credentials, shared)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    return principal


def get_principal(settings: SettingsDep, session: SessionDep, creds: Credentials) -> Principal:
    """The caller (401 for a missing, unknown or revoked key)."""
    return _principal(settings, session, creds)


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


async def presented_key(request: Request) -> HTTPAuthorizationCredentials | None:
    """The bearer credentials, 401 at once when auth is on and none were sent (before the
    body is read), for routes that verify the key inside their own threadpool call.

    `bearer` is called here rather than declared as a nested dependency (one dependency
    level less on the event loop of every submit); such routes name `BEARER_SECURITY` so
    the spec still shows the scheme they require."""
    creds = await bearer(request)
    return _bearer(creds) if request.app.state.settings.auth_enabled else creds


PresentedKey = Annotated[HTTPAuthorizationCredentials | None, Depends(presented_key)]
# The OpenAPI security requirement of a route that takes `PresentedKey`.
BEARER_SECURITY: dict[str, Any] = {"security": [{bearer.scheme_name: []}]}


@contextlib.contextmanager
def read_session(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session for a route that does all its work in one threadpool call: on PostgreSQL
    one pooled connection in autocommit (no BEGIN, no COMMIT: each statement is its own
    transaction, so a route that writes makes each write one statement), on SQLite a plain
    session whose transaction ends when it commits or closes."""
    engine = factory.kw["bind"]
    if engine.dialect.name == "sqlite":
        with factory() as session:
            yield session
        return
    with (
        engine.connect() as conn,
        Session(bind=conn.execution_options(isolation_level="AUTOCOMMIT")) as session,
    ):
        yield session


@contextlib.contextmanager
def route_session(request: Request) -> Iterator[tuple[Settings, Session, CapacityCache]]:
    """The app's settings, a `read_session` (closed on leaving) and the capacity cache, for
    a sync route that does all its work in its one threadpool call. Read from the app's
    state there, not resolved as three dependencies on the event loop: FastAPI's
    dependency solving was the largest part of a submit's event-loop work (cProfile). On
    PostgreSQL a submit is then at most two round trips: the key lookup and the one statement
    that writes the job and its event (`jobs.store.job_create.create_job`)."""
    state = request.app.state
    with read_session(state.session_factory) as session:
        yield state.settings, session, state.capacity


def principal_with_role(
    settings: Settings, session: Session, creds: HTTPAuthorizationCredentials | None, role: str
) -> Principal:
    """`get_principal` and `require(role)` as one call, for routes resolving the caller in
    the same threadpool call as their reads and writes (one hop instead of two, and on
    PostgreSQL the key lookup shares the route's connection)."""
    principal = _principal(settings, session, creds, shared=True)
    if not principal.can(role):
        raise ApiError(
            403,
            "forbidden",
            f"this key's role '{principal.role}' cannot do this; it needs '{role}' or higher",
        )
    return principal


class KeptPrincipals:
    """Submit keys this process verified, by hash, so that a submit can skip the lookup.

    A kept principal is only ever used for a write that re-checks it in its own statement
    (`KeyGuard`: the key is there, not revoked, in that project, with that remote-code
    grant); every other answer (a replay, a 409, a 422) asks the database first. A key's
    role and its project's name never change; its revocation and the project's grant are
    what the guard reads. At most `KEPT`, least recently used out first.
    """

    KEPT = 1024

    def __init__(self) -> None:
        self._kept: OrderedDict[str, Principal] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> Principal | None:
        with self._lock:
            found = self._kept.get(key_hash)
            if found is not None:
                self._kept.move_to_end(key_hash)
            return found

    def keep(self, key_hash: str, principal: Principal) -> None:
        with self._lock:
            self._kept[key_hash] = principal
            while len(self._kept) > self.KEPT:
                self._kept.popitem(last=False)

    def forget(self, key_hash: str) -> None:
        with self._lock:
            self._kept.pop(key_hash, None)


def submitter(
    settings: Settings,
    session: Session,
    creds: HTTPAuthorizationCredentials | None,
    kept: KeptPrincipals,
    fresh: bool = False,
) -> tuple[Principal, KeyGuard | None, bool]:
    """(the submitting principal, the guard its write must carry (None with auth off),
    whether it was kept rather than looked up). A kept principal answers without a lookup
    unless `fresh`; one looked up is kept."""
    if not settings.auth_enabled:
        return principal_with_role(settings, session, creds, "submit"), None, False
    key_hash = hash_key(_bearer(creds).credentials)
    principal = None if fresh else kept.get(key_hash)
    from_memory = principal is not None
    if principal is None:
        kept.forget(key_hash)
        principal = principal_with_role(settings, session, creds, "submit")
        kept.keep(key_hash, principal)
    guard = KeyGuard(key_hash, principal.project_id, principal.allow_remote_code)
    return principal, guard, from_memory


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
