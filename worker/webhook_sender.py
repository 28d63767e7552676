"""The webhook sender: delivers the outbox (`webhook_deliveries`) at least once, signed.

Each pass claims the due deliveries (`jobs.store.webhooks.claim_due_deliveries`, a lease as
long as one POST may take), commits, POSTs them side by side with httpx, and records each
attempt in a transaction of its own. A 2xx settles a delivery; anything else (another
status, a timeout, a refused connection) is tried again after an exponential backoff with
jitter, with the same `Tuneyard-Delivery` id, until `max_attempts`, after which it is
`failed`. A sender that dies mid-POST leaves its claims to expire and be sent again: a
receiver may see a delivery twice, always under the same id.

Every attempt is signed: `Tuneyard-Signature: t=<unix seconds>,v1=<hex>`, the hex being
HMAC-SHA256 with the webhook's secret over `<t>.<body>` (docs/webhooks.md). The host is
resolved once per attempt and the connection made to the address checked, so a name that
resolves to a private address is refused unless the operator allows those; redirects are
not followed and proxies from the environment are not used. `tuneyard scheduler` runs this
service in a thread beside the reconciler (`start_webhook_sender`), so `tuneyard up` and
every deployment with a scheduler send webhooks.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobs.store.engine import session_scope
from jobs.store.settings import Settings, get_settings
from jobs.store.tables import utcnow
from jobs.store.webhooks import (
    AttemptResult,
    DueDelivery,
    address_allowed,
    claim_due_deliveries,
    private_addresses_allowed,
    record_attempt,
)

log = logging.getLogger("tuneyard.webhooks")
USER_AGENT = "tuneyard-webhooks/1"
RESPONSE_CHARS = 1000  # of a receiver's answer kept with the delivery


class WebhookSenderConfig(BaseSettings):
    """`TUNEYARD_WEBHOOK_*`: how long a POST may take, how often and how far apart it is tried."""

    model_config = SettingsConfigDict(env_prefix="TUNEYARD_WEBHOOK_", extra="ignore")

    timeout_seconds: float = 10.0  # connect, read and write each
    max_attempts: int = 10  # then the delivery is `failed`
    backoff_seconds: float = 10.0  # before the 2nd attempt; doubled each time after
    backoff_max_seconds: float = 3600.0
    poll_seconds: float = 1.0  # how often the outbox is asked for due deliveries
    batch_size: int = 16  # deliveries claimed, and sent side by side, per pass

    @property
    def lease_seconds(self) -> float:
        """How long a claim holds: a POST's three timeouts, name resolution and a margin."""
        return 3 * self.timeout_seconds + 30.0


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `v1` signature: hex HMAC-SHA256 over `<timestamp>.<body>` with the secret."""
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def body_bytes(payload: dict[str, Any]) -> bytes:
    """The delivery's body: the same bytes on every attempt (keys sorted, no spaces)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def backoff_delay(attempt: int, config: WebhookSenderConfig) -> float:
    """Seconds before the attempt after `attempt`: doubling from `backoff_seconds`, capped,
    and spread by ±20% so receivers that failed together are not retried together."""
    delay = min(config.backoff_max_seconds, config.backoff_seconds * 2 ** (attempt - 1))
    return delay * random.uniform(0.8, 1.2)


def retry_at(attempt: int, config: WebhookSenderConfig) -> datetime | None:
    """When to try again after attempt number `attempt` failed; None once they are spent."""
    if attempt >= config.max_attempts:
        return None
    return utcnow() + timedelta(seconds=backoff_delay(attempt, config))


def checked_addresses(url: str, allow_private: bool) -> list[str]:
    """The addresses the URL's host resolves to, each one allowed; ValueError when the name
    does not resolve or any address is refused (one private answer is enough to refuse)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"cannot resolve {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    refused = [a for a in addresses if not address_allowed(a, allow_private)]
    if refused or not addresses:
        raise ValueError(
            f"{host} resolves to a private or reserved address ({', '.join(refused)}); "
            "set TUNEYARD_WEBHOOK_ALLOW_PRIVATE=1 to allow it"
        )
    return addresses


def signed_headers(delivery: DueDelivery, body: bytes) -> dict[str, str]:
    timestamp = int(time.time())
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Tuneyard-Event": delivery.event,
        "Tuneyard-Delivery": delivery.delivery_id,
        "Tuneyard-Attempt": str(delivery.attempt),
        "Tuneyard-Signature": f"t={timestamp},v1={sign(delivery.secret, timestamp, body)}",
    }


def post_delivery(
    client: httpx.Client, delivery: DueDelivery, allow_private: bool
) -> AttemptResult:
    """One signed POST of `delivery`: its status and the start of the answer, or the error."""
    body = body_bytes(delivery.payload)
    try:
        addresses = checked_addresses(delivery.url, allow_private)
        status, answer = _post_pinned(
            client, httpx.URL(delivery.url), addresses, body, signed_headers(delivery, body)
        )
    except (httpx.HTTPError, ValueError) as exc:
        return AttemptResult(error=f"{type(exc).__name__}: {exc}"[:RESPONSE_CHARS])
    return AttemptResult(status_code=status, response=answer)


def _post_pinned(
    client: httpx.Client, url: httpx.URL, addresses: list[str], body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    """POST to each checked address in turn until one takes the connection. The connection
    goes to an address checked before, never to a second lookup's answer; the Host header
    and TLS (server name, certificate) still use the URL's own name."""
    headers = {**headers, "Host": url.netloc.decode("ascii")}
    server_name = url.raw_host.decode("ascii")
    for address in addresses[:-1]:
        with contextlib.suppress(httpx.ConnectError):
            return _post_once(client, url.copy_with(host=address), body, headers, server_name)
    return _post_once(client, url.copy_with(host=addresses[-1]), body, headers, server_name)


def _post_once(
    client: httpx.Client, target: httpx.URL, body: bytes, headers: dict[str, str], server_name: str
) -> tuple[int, str]:
    request = client.build_request(
        "POST", target, content=body, headers=headers, extensions={"sni_hostname": server_name}
    )
    response = client.send(request, stream=True)
    try:
        return response.status_code, _read_start(response)
    finally:
        response.close()


def _read_start(response: httpx.Response) -> str:
    """The first RESPONSE_CHARS bytes of the answer, decoded; the rest is never read."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= RESPONSE_CHARS:
            break
    return b"".join(chunks)[:RESPONSE_CHARS].decode("utf-8", errors="replace")


class WebhookSender:
    """The outbox's delivery service: `send_due` is one pass, `run` the loop."""

    def __init__(
        self,
        config: WebhookSenderConfig | None = None,
        settings: Settings | None = None,
        allow_private: bool | None = None,
    ):
        self.config = config or WebhookSenderConfig()
        self.settings = settings = settings or get_settings()
        self.allow_private = (
            private_addresses_allowed(settings) if allow_private is None else allow_private
        )
        timeout = httpx.Timeout(self.config.timeout_seconds)
        self.client = httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False)
        self.pool = ThreadPoolExecutor(self.config.batch_size, thread_name_prefix="webhook")

    def send_due(self) -> int:
        """Claim what is due, send it, record every attempt; returns how many were sent."""
        with session_scope(self.settings) as session:
            due = claim_due_deliveries(session, self.config.batch_size, self.config.lease_seconds)
        for delivery, result in zip(due, self.pool.map(self._post, due), strict=True):
            with session_scope(self.settings) as session:
                next_try = None if result.ok else retry_at(delivery.attempt, self.config)
                if not record_attempt(session, delivery, result, next_try):
                    log.info("delivery %s: claim lost; result dropped", delivery.delivery_id)
            if not result.ok:
                log.info(
                    "delivery %s (%s) attempt %d failed: %s",
                    delivery.delivery_id,
                    delivery.event,
                    delivery.attempt,
                    result.error or result.status_code,
                )
        return len(due)

    def _post(self, delivery: DueDelivery) -> AttemptResult:
        return post_delivery(self.client, delivery, self.allow_private)

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until `stop`; a full batch is followed at once by the next."""
        log.info("webhook sender polling every %.1fs", self.config.poll_seconds)
        while not stop.is_set():
            try:
                sent = self.send_due()
            except Exception as exc:  # the database is down: try again next pass
                first_line = f"{exc}".split("\n", 1)[0]
                log.warning("webhook pass failed: %s: %s", type(exc).__name__, first_line)
                sent = 0
            if sent < self.config.batch_size:
                stop.wait(self.config.poll_seconds)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


def start_webhook_sender(stop: threading.Event | None = None) -> threading.Thread:
    """Run a `WebhookSender` in a daemon thread (beside `tuneyard scheduler`'s reconciler)."""
    stop = stop or threading.Event()
    sender = WebhookSender()

    def loop() -> None:
        try:
            sender.run(stop)
        finally:
            sender.close()

    thread = threading.Thread(target=loop, name="webhook-sender", daemon=True)
    thread.start()
    return thread
