"""`/v1/projects/{name}/webhooks`: a project's webhook subscriptions and their deliveries.

Only an admin key of the project manages them (create, list, read, delete) and reads their
deliveries: a subscription's URL may carry a receiver's token. Another project's name, or
another project's webhook id, is simply not found. The secret is never answered back. A URL
naming a private address is refused unless the operator allows it
(`jobs.store.webhooks.private_addresses_allowed`); deleting a webhook drops its pending
deliveries with it.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from api.deps import Admin, SessionDep, SettingsDep
from api.errors import ApiError, InvalidRequest, not_found
from api.limits import BoundedJsonRoute
from api.pages import CURSOR_DOC, numeric_cursor
from api.routes.jobs import AUTH_ERRORS, INVALID
from api.schemas import ErrorOut
from api.webhook_schemas import (
    DeliveriesPublic,
    DeliveryPublic,
    WebhookCreate,
    WebhookPublic,
    WebhooksPublic,
)
from jobs.store import webhooks as store
from jobs.store.api_keys import Principal
from jobs.store.tables import Webhook, WebhookDelivery

router = APIRouter(prefix="/v1", tags=["webhooks"], route_class=BoundedJsonRoute)
log = logging.getLogger("tuneyard.api")

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No such project or webhook for this key."}
}
WebhookId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def _project_id(name: str, principal: Principal) -> int:
    if name != principal.project_name:
        raise not_found("project", name)
    return principal.project_id


def _own_webhook(session: SessionDep, name: str, principal: Principal, webhook_id: int) -> Webhook:
    webhook = store.get_webhook(session, _project_id(name, principal), webhook_id)
    if webhook is None:
        raise not_found("webhook", str(webhook_id))
    return webhook


def _public(webhook: Webhook) -> WebhookPublic:
    return WebhookPublic.model_validate(webhook, from_attributes=True)


def _delivery(row: WebhookDelivery) -> DeliveryPublic:
    return DeliveryPublic(
        id=row.delivery_id,
        **{name: getattr(row, name) for name in DeliveryPublic.model_fields if name != "id"},
    )


@router.post(
    "/projects/{name}/webhooks",
    status_code=201,
    response_model=WebhookPublic,
    summary="Subscribe a URL to the project's events (admin)",
    responses={**NOT_FOUND, **INVALID, **AUTH_ERRORS},
)
def create_webhook(
    name: str, body: WebhookCreate, principal: Admin, session: SessionDep, settings: SettingsDep
) -> WebhookPublic:
    project_id = _project_id(name, principal)
    problem = store.url_problem(body.url, store.private_addresses_allowed(settings))
    if problem is not None:
        raise InvalidRequest([problem])
    try:
        webhook = store.create_webhook(
            session, project_id, body.url, body.events, body.secret.get_secret_value()
        )
    except ValueError as exc:
        raise ApiError(409, "conflict", str(exc)) from exc
    session.commit()
    log.info("project %s: webhook %d created (key %s)", name, webhook.id, principal.key_id)
    return _public(webhook)


@router.get(
    "/projects/{name}/webhooks",
    response_model=WebhooksPublic,
    summary="The project's webhooks (admin)",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def list_webhooks(name: str, principal: Admin, session: SessionDep) -> WebhooksPublic:
    hooks = store.list_webhooks(session, _project_id(name, principal))
    return WebhooksPublic(data=[_public(h) for h in hooks])


@router.get(
    "/projects/{name}/webhooks/{webhook_id}",
    response_model=WebhookPublic,
    summary="One webhook (admin)",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def get_webhook(
    name: str, webhook_id: WebhookId, principal: Admin, session: SessionDep
) -> WebhookPublic:
    return _public(_own_webhook(session, name, principal, webhook_id))


@router.delete(
    "/projects/{name}/webhooks/{webhook_id}",
    status_code=204,
    summary="Delete a webhook and its pending deliveries (admin)",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def delete_webhook(
    name: str, webhook_id: WebhookId, principal: Admin, session: SessionDep
) -> Response:
    if not store.delete_webhook(session, _project_id(name, principal), webhook_id):
        raise not_found("webhook", str(webhook_id))
    session.commit()
    log.info("project %s: webhook %d deleted (key %s)", name, webhook_id, principal.key_id)
    return Response(status_code=204)


@router.get(
    "/projects/{name}/webhooks/{webhook_id}/deliveries",
    response_model=DeliveriesPublic,
    summary="A webhook's deliveries, newest first (admin)",
    responses={**NOT_FOUND, **INVALID, **AUTH_ERRORS},
)
def list_deliveries(
    name: str,
    webhook_id: WebhookId,
    principal: Admin,
    session: SessionDep,
    cursor: Annotated[str | None, Query(max_length=20, description=CURSOR_DOC)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> DeliveriesPublic:
    webhook = _own_webhook(session, name, principal, webhook_id)
    rows = store.list_deliveries(session, webhook.id, numeric_cursor(cursor, None), limit + 1)
    has_more, rows = len(rows) > limit, rows[:limit]
    return DeliveriesPublic(
        data=[_delivery(r) for r in rows],
        has_more=has_more,
        next_cursor=str(rows[-1].id) if has_more else None,
    )
