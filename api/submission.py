"""From a `JobCreate` body to a stored, queued job: validation, queue choice, enqueue.

Validation is `jobs.recipe.validation.validate_job`, the same code `tuneyard validate` runs
(through `api.validation_memo`, which answers a repeated recipe when nothing it read has
changed), given the caller's project as a `JobScope` (its jobs, from the database); its
FieldErrors become the 422 body. The queue's capacity goes in too: the device memory its live workers
advertise (a job whose estimate cannot fit is refused at `distributed`) and the throughput
its finished jobs measured (the estimate's time), kept a few seconds per queue by the
app's `CapacityCache`. A submit is one transaction: the job, its `submitted` event and its
dispatch mark are committed together, and the broker hears the id after that commit. When
the broker refuses, the job stays `queued` and the reconciler sends it again once its
grace window has passed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.orm import Session

from api.deps import KeptPrincipals, end_read, submitter
from api.errors import ApiError, InvalidRequest
from api.schemas import JobCreate
from api.validation_memo import validate_cached
from jobs.broker import dispatch_job, enqueue_job
from jobs.recipe.bounds import check_bounds
from jobs.recipe.errors import FieldError
from jobs.recipe.requirements import requirement_errors
from jobs.recipe.scope import JobScope
from jobs.store import queries as store
from jobs.store.api_keys import KeyGuard, Principal
from jobs.store.capacity import CapacityCache
from jobs.store.leases import live_worker_packages
from jobs.store.settings import Settings
from jobs.store.tables import Job, utcnow

log = logging.getLogger("tuneyard.api")
BAD_TEXT = "contains a NUL character or invalid unicode"


@dataclass
class Validated:
    recipe: dict[str, Any]
    plan: dict[str, Any]
    resources: dict[str, Any]
    queue: str
    spec: dict[str, Any]  # the request as JSON, dumped once


def queue_for(resources: dict[str, Any]) -> str:
    """`cpu`, or `gpu-<n>` for n GPUs per node (workers listen by resource class)."""
    if resources.get("accelerator") == "cuda":
        return f"gpu-{resources.get('nproc_per_node', 1)}"
    return "cpu"


def _recipe_input(body: JobCreate) -> dict[str, Any] | str:
    if (body.recipe is None) == (body.recipe_yaml is None):
        raise InvalidRequest(
            [
                FieldError(
                    "recipe",
                    "give exactly one of `recipe` (an object) or `recipe_yaml` (text)",
                    "send the recipe as a JSON object in `recipe`, or its YAML text in `recipe_yaml`",
                )
            ]
        )
    if body.recipe is not None:
        return body.recipe
    # A one-line string ending in .yaml would be read as a server-side path: never do that.
    text = body.recipe_yaml or ""
    return text if "\n" in text else text + "\n"


def _storable(text: str) -> bool:
    """PostgreSQL text and JSONB refuse NUL characters; UTF-8 refuses lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def unstorable_text(value: Any, loc: str = "") -> list[FieldError]:
    """A FieldError for every string (or key) in `value` that the database cannot store.

    orjson refuses a lone surrogate and writes a NUL as `\\u0000`: a value it writes without
    one holds nothing to report (a microsecond, where the walk costs ~10 µs per KB)."""
    if not loc and _plainly_storable(value):
        return []
    if isinstance(value, str):
        return [] if _storable(value) else [FieldError(loc or "body", BAD_TEXT, "remove it")]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return []
    found: list[FieldError] = []
    for key, item in items:
        where = f"{loc}.{key}" if loc else str(key)
        if isinstance(key, str) and not _storable(key):
            found.append(FieldError(loc or "body", f"a key {BAD_TEXT}", "rename the key"))
        found += unstorable_text(item, where)
    return found


def _plainly_storable(value: Any) -> bool:
    try:
        return b"\\u0000" not in orjson.dumps(value)
    except TypeError:  # a lone surrogate (or a value orjson cannot write): walk it
        return False


def project_scope(session: Session, principal: Principal) -> JobScope:
    """The caller's project for validation: its job ids, and where each keeps checkpoints.

    Each lookup ends its read transaction at once (nothing is pending: the principal's was
    committed), so no pooled connection is held while validation goes on reading files.
    """

    def ended(value: Any) -> Any:
        end_read(session)
        return value

    return JobScope(
        project=principal.project_name,
        owns_job=lambda job_id: ended(store.owns_job(session, principal.project_id, job_id)),
        checkpoint_dir_of=lambda job_id: ended(
            store.job_checkpoint_dir(session, principal.project_id, job_id)
        ),
    )


def check_request(
    body: JobCreate,
    settings: Settings,
    principal: Principal,
    session: Session,
    capacity: CapacityCache,
) -> Validated:
    """Run every check; returns what to store, or raises InvalidRequest.

    The principal brings its project's remote-code grant (the operator's is in `settings`)
    and its scope: checkpoint and restore paths stay in that project's runs.
    """
    # Bounds first: dumping a recipe nested hundreds deep is itself what would fail.
    out_of_bounds = check_bounds(body.recipe) if body.recipe is not None else []
    if out_of_bounds:
        raise InvalidRequest(out_of_bounds)
    spec = body.model_dump(mode="json")
    bad_text = unstorable_text(spec)
    if bad_text:
        raise InvalidRequest(bad_text[:20])
    resources = body.resources.model_dump()
    grant, scope = principal.allow_remote_code, project_scope(session, principal)
    queue = queue_for(resources)
    memory, rate = capacity.get(session, queue)
    end_read(session)
    result = validate_cached(
        _recipe_input(body),
        body.overrides,
        resources,
        settings,
        grant,
        scope=scope,
        device_memory=memory,
        flops_per_rank=rate,
        handed_over=body.recipe is not None,
    )
    if not result.valid or result.recipe is None:
        raise InvalidRequest(result.errors or [FieldError("recipe", "invalid", "")])
    plan = _with_worker_check(result.plan, queue, session, settings)
    return Validated(result.recipe, plan, resources, queue, spec)


def _with_worker_check(
    plan: dict[str, Any], queue: str, session: Session, settings: Settings
) -> dict[str, Any]:
    """Refuse a job no live worker of its queue can run; warn when none is live to ask."""
    sources = plan.get("requires") or {}
    if not sources:
        return plan
    fresh_after = utcnow() - timedelta(seconds=settings.worker_live_seconds)
    live = live_worker_packages(session, queue, fresh_after)
    end_read(session)
    errors, warnings = requirement_errors(sources, queue, live)
    if errors:
        raise InvalidRequest(errors)
    return {**plan, "warnings": [*plan.get("warnings", []), *(w.to_dict() for w in warnings)]}


def replayed_job(
    session: Session, principal: Principal, idempotency_key: str | None, body: JobCreate
) -> Job | None:
    """The job a retried submit already created; IdempotencyConflict for another body."""
    if not idempotency_key:
        return None
    existing = store.find_by_idempotency_key(session, principal.project_id, idempotency_key)
    end_read(session)
    if existing is None:
        return None
    if existing.request_hash != store.request_hash(body.model_dump(mode="json")):
        raise store.IdempotencyConflict(existing)
    return existing


def new_job(body: JobCreate, checked: Validated, idempotency_key: str | None) -> store.NewJob:
    spec = checked.spec
    return store.NewJob(
        name=body.name or _default_name(checked.recipe),
        spec=spec,
        recipe=checked.recipe,
        plan=checked.plan,
        resources=checked.resources,
        queue=checked.queue,
        priority=body.priority,
        labels=dict(body.labels),
        max_attempts=body.max_attempts,
        idempotency_key=idempotency_key,
        request_hash=store.request_hash(spec),
    )


def _default_name(recipe: dict[str, Any]) -> str:
    model = recipe.get("model") if isinstance(recipe.get("model"), dict) else {}
    source = str(model.get("pretrained_model_name_or_path") or "job")
    return source.rstrip("/").rsplit("/", 1)[-1][:200] or "job"


def send_new_job(session: Session, job: Job, settings: Settings) -> bool:
    """Send a job created with its dispatch mark. On refusal (logged) the mark is taken back,
    so the answer says `dispatched_at: null`, and the reconciler sends the job later."""
    try:
        enqueue_job(job.id, job.queue, settings)
    except Exception as exc:  # any transport error: the reconciler re-dispatches queued jobs
        log.warning("job %s stays queued: the broker refused it (%s)", job.id, exc)
        try:
            store.clear_dispatched(session, job.id)
            session.commit()
            job.dispatched_at = None
        except Exception as db_exc:  # the reconciler's grace window covers this too
            session.rollback()
            log.warning("job %s: could not clear its dispatch mark (%s)", job.id, db_exc)
        return False
    return True


def enqueue(session: Session, job: Job, settings: Settings) -> bool:
    """Send a committed job (a resumed one) to the broker and record the dispatch."""
    sent = dispatch_job(session, job.id, job.queue, settings)
    if sent:
        session.refresh(job, ["dispatched_at"])
    return sent


def submit(
    body: JobCreate,
    settings: Settings,
    session: Session,
    capacity: CapacityCache,
    creds: HTTPAuthorizationCredentials | None,
    kept: KeptPrincipals,
    idempotency_key: str | None,
) -> tuple[Job, bool, Principal]:
    """A submit from the caller's key to the queued job: (job, created, principal).

    A key this process verified before is not looked up again: the insert checks it in the
    same statement (`KeyGuard`), so on PostgreSQL a submit is one round trip. When the
    guard refuses (the key was revoked, the project's grant changed), and before a 422 is
    answered on a kept key, the key is asked afresh: a revoked key hears 401, a changed
    grant is validated again. A replay (an Idempotency-Key) always asks first, since it
    answers a stored job without writing.
    """
    principal, guard, from_memory = submitter(
        settings, session, creds, kept, fresh=bool(idempotency_key)
    )
    for _ in range(2):
        try:
            job, created = _submit_as(
                principal, guard, body, settings, session, capacity, idempotency_key
            )
            return job, created, principal
        except InvalidRequest:
            if not from_memory:
                raise
            was = principal
            principal, guard, from_memory = submitter(settings, session, creds, kept, True)
            if principal == was:
                raise  # the key holds, and what validation read of it is unchanged
        except store.KeyRefused:
            principal, guard, from_memory = submitter(settings, session, creds, kept, True)
    assert guard is not None  # only a guarded write refuses
    kept.forget(guard.key_hash)
    raise ApiError(401, "unauthorized", "unknown or revoked API key")


def _submit_as(
    principal: Principal,
    guard: KeyGuard | None,
    body: JobCreate,
    settings: Settings,
    session: Session,
    capacity: CapacityCache,
    idempotency_key: str | None,
) -> tuple[Job, bool]:
    replayed = replayed_job(session, principal, idempotency_key, body)
    if replayed is not None:
        return replayed, False
    checked = check_request(body, settings, principal, session, capacity)
    job, created = store.create_job(
        session,
        principal.project_id,
        new_job(body, checked, idempotency_key),
        looked_up=True,
        dispatching=True,
        guard=guard,
    )
    if created:
        send_new_job(session, job, settings)
    return job, created
