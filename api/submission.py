"""From a `JobCreate` body to a stored, queued job: `submit` and the checks it shares with
`POST /v1/jobs:validate` (`check_request`).

A submit reads top to bottom: an Idempotency-Key already used answers its stored job;
otherwise `check_request` validates everything (`jobs.recipe.validation.validate_job`, the
code `tuneyard validate` runs, given the caller's project as a `JobScope` and the queue's
capacity), `store.create_job` adds the job, its `submitted` event and its dispatch mark to
the request's transaction, the commit stores them, and only then
`broker.dispatch_new_job` sends the id. A broker that refuses leaves the job `queued`, its
mark taken back, for the reconciler. Every check happens before the commit; after it
nothing can fail but the send, which never raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from api.errors import InvalidRequest
from api.schemas import JobCreate
from jobs.broker import dispatch_new_job
from jobs.recipe.errors import FieldError
from jobs.recipe.load.bounds import NodeBudget, check_bounds
from jobs.recipe.paths.scope import JobScope
from jobs.recipe.plan.requirements import requirement_errors
from jobs.recipe.validation import validate_job
from jobs.store import queries as store
from jobs.store.api_keys import Principal
from jobs.store.capacity import CapacityCache
from jobs.store.leases import live_worker_packages
from jobs.store.settings import Settings
from jobs.store.tables import Job, utcnow

BAD_TEXT = "contains a NUL character or invalid unicode"
MAX_TEXT_ERRORS = 20


@dataclass
class Validated:
    recipe: dict[str, Any]
    plan: dict[str, Any]
    resources: dict[str, Any]
    queue: str
    spec: dict[str, Any]  # the request as JSON


def submit(
    session: Session,
    principal: Principal,
    body: JobCreate,
    settings: Settings,
    capacity: CapacityCache,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """Validate, store and queue a job; (the job, whether this call created it).

    Raises InvalidRequest (422, nothing stored) and store.IdempotencyConflict (409)."""
    if idempotency_key:
        stored = store.find_by_idempotency_key(session, principal.project_id, idempotency_key)
        if stored is not None:  # answered without validating again: accepted once, accepted
            return store.replay_or_conflict(stored, store.request_hash(_spec(body))), False
    checked = check_request(body, settings, principal, session, capacity)
    job, created = store.create_job(
        session, principal.project_id, new_job(body, checked, idempotency_key), dispatching=True
    )
    session.commit()
    if created:
        dispatch_new_job(session, job, settings)
    return job, created


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
    # Bounds first: dumping a recipe nested hundreds deep is itself what would fail. One
    # budget for the whole request: validate_job counts the overrides against what is left.
    budget = NodeBudget()
    out_of_bounds = check_bounds(body.recipe, budget=budget) if body.recipe is not None else []
    if out_of_bounds:
        raise InvalidRequest(out_of_bounds)
    spec = _spec(body)
    bad_text = unstorable_text(spec)
    if bad_text:
        raise InvalidRequest(bad_text[:MAX_TEXT_ERRORS])
    resources = body.resources.model_dump()
    queue = queue_for(resources)
    memory, rate = capacity.get(session, queue)
    result = validate_job(
        _recipe_input(body),
        body.overrides,
        resources,
        settings,
        principal.allow_remote_code,
        scope=project_scope(session, principal),
        device_memory=memory,
        flops_per_rank=rate,
        budget=budget,
    )
    if not result.valid or result.recipe is None:
        raise InvalidRequest(result.errors or [FieldError("recipe", "invalid", "")])
    plan = _with_worker_check(result.plan, queue, session, settings)
    return Validated(result.recipe, plan, resources, queue, spec)


def queue_for(resources: dict[str, Any]) -> str:
    """`cpu`, or `gpu-<n>` for n GPUs per node (workers listen by resource class)."""
    if resources.get("accelerator") == "cuda":
        return f"gpu-{resources.get('nproc_per_node', 1)}"
    return "cpu"


def _spec(body: JobCreate) -> dict[str, Any]:
    return body.model_dump(mode="json")


def _recipe_input(body: JobCreate) -> dict[str, Any] | str:
    if (body.recipe is None) == (body.recipe_yaml is None):
        raise InvalidRequest(
            [
                FieldError(
                    "recipe",
                    "give exactly one of `recipe` (an object) or `recipe_yaml` (text)",
                    "send the recipe as a JSON object in `recipe`, or its YAML text in "
                    "`recipe_yaml`",
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
    """A FieldError for every string (or key) in `value` that the database cannot store."""
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


def project_scope(session: Session, principal: Principal) -> JobScope:
    """The caller's project for validation: its name (its directory under each checkpoint
    root), its job ids, and where each keeps checkpoints."""
    return JobScope(
        project=principal.project_name,
        owns_job=lambda job_id: store.owns_job(session, principal.project_id, job_id),
        checkpoint_dir_of=lambda job_id: store.job_checkpoint_dir(
            session, principal.project_id, job_id
        ),
    )


def _with_worker_check(
    plan: dict[str, Any], queue: str, session: Session, settings: Settings
) -> dict[str, Any]:
    """Refuse a job no live worker of its queue can run; warn when none is live to ask."""
    sources = plan.get("requires") or {}
    if not sources:
        return plan
    fresh_after = utcnow() - timedelta(seconds=settings.worker_live_seconds)
    live = live_worker_packages(session, queue, fresh_after)
    errors, warnings = requirement_errors(sources, queue, live)
    if errors:
        raise InvalidRequest(errors)
    return {**plan, "warnings": [*plan.get("warnings", []), *(w.to_dict() for w in warnings)]}


def new_job(body: JobCreate, checked: Validated, idempotency_key: str | None) -> store.NewJob:
    return store.NewJob(
        name=body.name or _default_name(checked.recipe),
        spec=checked.spec,
        recipe=checked.recipe,
        plan=checked.plan,
        resources=checked.resources,
        queue=checked.queue,
        priority=body.priority,
        labels=dict(body.labels),
        max_attempts=body.max_attempts,
        idempotency_key=idempotency_key,
        request_hash=store.request_hash(checked.spec),
    )


def _default_name(recipe: dict[str, Any]) -> str:
    model = recipe.get("model") if isinstance(recipe.get("model"), dict) else {}
    source = str(model.get("pretrained_model_name_or_path") or "job")
    return source.rstrip("/").rsplit("/", 1)[-1][:200] or "job"
