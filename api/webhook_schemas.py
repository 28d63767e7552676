"""HTTP models of `/v1/projects/{name}/webhooks`: `WebhookCreate` in, `WebhookPublic` /
`WebhooksPublic` and `DeliveryPublic` / `DeliveriesPublic` out.

The secret is write-only: `WebhookCreate` reads it as a `SecretStr` (never shown in a log or
an error) and no answer carries it. The URL's form and the event names are checked here,
with a fix for each; whether the URL may point at a private address is the operator's
setting, checked by the route.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

from api.schemas import NEXT_CURSOR
from jobs.recipe.errors import did_you_mean
from jobs.recipe.load.bounds import CONTROL_FIX, control_msg, unsafe_char
from jobs.store.webhooks import EVENTS, MAX_URL_LENGTH, url_problem


def _known_event(name: str) -> str:
    if name not in EVENTS:
        hint = did_you_mean(name, EVENTS) or f"use one of {', '.join(EVENTS)}"
        raise ValueError(f"unknown event {name[:64]!r} | fix: {hint}")
    return name


def _url_form(url: str) -> str:
    problem = url_problem(url, allow_private=True)
    if problem is not None:
        raise ValueError(f"{problem.msg} | fix: {problem.fix}")
    return url


def _printable_secret(secret: SecretStr) -> SecretStr:
    value = secret.get_secret_value()
    char = unsafe_char(value)
    if char is not None:
        raise ValueError(f"{control_msg(char)} | fix: {CONTROL_FIX}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"holds a lone surrogate, which is no text | fix: {CONTROL_FIX}") from None
    return secret


EventName = Annotated[str, Field(max_length=64), AfterValidator(_known_event)]


class WebhookCreate(BaseModel):
    """A subscription: where to POST, which events, and the secret that signs them."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "url": "https://ci.example.com/tuneyard",
                    "events": ["job.succeeded", "job.failed", "job.cancelled"],
                    "secret": "a-long-random-string-from-your-secret-store",
                }
            ]
        },
    )

    url: Annotated[str, AfterValidator(_url_form)] = Field(
        max_length=MAX_URL_LENGTH, description="An http or https URL without credentials."
    )
    events: list[EventName] = Field(
        min_length=1, max_length=len(EVENTS), description=f"Any of: {', '.join(EVENTS)}."
    )
    secret: Annotated[SecretStr, AfterValidator(_printable_secret)] = Field(
        min_length=16,
        max_length=256,
        description="Signs each delivery (HMAC-SHA256); write-only, never answered back.",
    )


class WebhookPublic(BaseModel):
    id: int
    url: str
    events: list[str]
    created_at: datetime


class WebhooksPublic(BaseModel):
    data: list[WebhookPublic]
    has_more: bool = Field(False, description="More items follow this page.")
    next_cursor: str | None = Field(None, description=NEXT_CURSOR)


class DeliveryPublic(BaseModel):
    id: str = Field(description="The delivery id, sent as Tuneyard-Delivery on every attempt.")
    event: str
    status: str = Field(description="pending (to be tried again), succeeded or failed.")
    attempts: int
    last_status_code: int | None = Field(None, description="The receiver's last HTTP status.")
    last_response: str | None = Field(None, description="The start of its last answer.")
    last_error: str | None = Field(None, description="Why the last attempt got no answer.")
    next_attempt_at: datetime | None = None
    last_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    created_at: datetime
    payload: dict[str, Any] = Field(description="The body sent (without the signature).")


class DeliveriesPublic(BaseModel):
    data: list[DeliveryPublic]
    has_more: bool = Field(False, description="More items follow this page.")
    next_cursor: str | None = Field(None, description=NEXT_CURSOR)
