"""The CLI's HTTP client for the `/v1` API, and how it turns an error answer into a message.

`TuneyardClient` makes the calls; any answer of 400 or more, or no answer at all, becomes a
`ClientError` carrying the exit code the command ends with and what to tell the user, read
from the API's error shapes (api/errors.py): `{"error": {"code", "message",
"current_status"?, ...}}`, or `{"errors": [{"loc", "msg", "fix"}]}` for a 422. It keeps the
server's error code, HTTP status and extra fields (an ambiguous job id's `candidates`), so
`--json` can print the refusal as the server gave it.
httpx is imported only when a client is made: `cli.main` imports the topic modules, which
import this one, at every `tuneyard` start (`tuneyard validate` included).
"""

from __future__ import annotations

import time
from enum import IntEnum
from typing import Any, Protocol

from jobs.store.status import SETTLED

DEFAULT_URL = "http://127.0.0.1:8000"


class CliExitCode(IntEnum):
    """What a `tuneyard` client command exits with: the mapping CI scripts rely on.

    A job's end maps onto it by status (`succeeded` 0, `failed` 1, `cancelled` 3, `paused`
    5); a refused request is 2, `wait --timeout` running out 4, no server answer 6. These
    are the CLI's own codes, distinct from the trainer's exit codes in
    `jobs.recipe.exit_codes`, which only the worker reads.
    """

    SUCCEEDED = 0
    FAILED = 1
    REFUSED = 2  # the server refused the request: 401/403/404/409/422
    CANCELLED = 3
    TIMED_OUT = 4  # `wait --timeout` ran out before the job finished
    PAUSED = 5  # the job is paused: no progress until someone resumes it
    UNREACHABLE = 6  # no answer from the server, or a 5xx


# The error code of a refusal the CLI made itself, by its exit code.
LOCAL_CODES = {
    CliExitCode.REFUSED: "invalid_request",
    CliExitCode.TIMED_OUT: "timed_out",
    CliExitCode.UNREACHABLE: "unreachable",
}


class ClientError(Exception):
    """A request the CLI cannot complete: the exit code and what to tell the user.

    `errors` holds a 422's field errors; `current_status` is the job's state when a 409
    refused an action on it; `code`, `http_status` and `detail` are the server's error code,
    the answer's status and the rest of its error object (None and empty when no server
    answered).
    """

    def __init__(
        self,
        message: str,
        exit_code: CliExitCode,
        errors: list[dict] | None = None,
        current_status: str | None = None,
        code: str | None = None,
        http_status: int | None = None,
        detail: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.exit_code = exit_code
        self.errors = errors or []
        self.current_status = current_status
        self.code = code or LOCAL_CODES.get(exit_code, "error")
        self.http_status = http_status
        self.detail = detail or {}


class Response(Protocol):
    """What `error_from_response` reads of an answer (an httpx.Response has it)."""

    status_code: int
    text: str

    def json(self) -> Any: ...


def _json_body(response: Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:  # not JSON: a proxy's HTML page, a plain-text 502
        return {}
    return body if isinstance(body, dict) else {}


def error_from_response(response: Response) -> ClientError:
    """The ClientError for an error answer, worded from the body the API sent."""
    status = response.status_code
    body = _json_body(response)
    detail = body.get("error") if isinstance(body.get("error"), dict) else {}
    errors = [e for e in body.get("errors") or [] if isinstance(e, dict)]
    message = detail.get("message") or ""
    if errors:
        count = len(errors)
        message = f"the server refused the request ({count} problem{'s' if count > 1 else ''}):"
    elif not message:
        text = " ".join(response.text.split())[:300]
        message = f"HTTP {status}" + (f": {text}" if text else "")
    if status == 401:
        message += "; set TUNEYARD_API_KEY or --api-key to a valid key (`tuneyard keys create`)"
    if errors:
        code = "invalid_fields"
    else:
        code = detail.get("code") if isinstance(detail.get("code"), str) else f"http_{status}"
    extra = {k: v for k, v in detail.items() if k not in ("code", "message", "current_status")}
    return ClientError(
        message,
        CliExitCode.UNREACHABLE if status >= 500 else CliExitCode.REFUSED,
        errors,
        current_status=detail.get("current_status"),
        code=code,
        http_status=status,
        detail=extra,
    )


def items_of(body: Any) -> list:
    """The records of a collection answer (`{"data": [...], ...}`)."""
    return body.get("data", []) if isinstance(body, dict) else []


def _present(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class TuneyardClient:
    """A small synchronous client for the `/v1` API."""

    def __init__(self, server: str = DEFAULT_URL, api_key: str | None = None, timeout=30.0):
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.server = server.rstrip("/")
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(
                f"cannot reach {self.server}: {exc}; is the server up (`tuneyard up`) "
                "and --server / TUNEYARD_URL right?",
                CliExitCode.UNREACHABLE,
            ) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        if not response.content:
            return None
        if "json" in response.headers.get("content-type", ""):
            return response.json()
        return response.text

    def submit(self, body: dict, idempotency_key: str | None = None) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/jobs", json=body, headers=headers)

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def jobs(self, **params: Any) -> list[dict]:
        return items_of(self.request("GET", "/v1/jobs", params=_present(params)))

    def action(self, job_id: str, verb: str) -> dict:
        return self.request("POST", f"/v1/jobs/{job_id}/{verb}")

    def metrics(
        self, job_id: str, cursor: str | None = None, max_points: int | None = None
    ) -> dict:
        """One page of train records: `data`, and `next_cursor` to poll on with."""
        params = {"kind": "train", "limit": 1000, "cursor": cursor, "max_points": max_points}
        return self.request("GET", f"/v1/jobs/{job_id}/metrics", params=_present(params))

    def checkpoints(self, job_id: str) -> list[dict]:
        return items_of(self.request("GET", f"/v1/jobs/{job_id}/checkpoints"))

    def logs(self, job_id: str, cursor: str | None = None) -> dict:
        """One page of log lines: `data`, `has_more` and `next_cursor`."""
        return self.request("GET", f"/v1/jobs/{job_id}/logs", params=_present({"cursor": cursor}))

    def wait_for(self, job_id: str, timeout: float | None, poll: float) -> dict:
        """Poll until the job ends (or pauses); raises ClientError(TIMED_OUT) after `timeout`."""
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            job = self.job(job_id)
            if job["status"] in SETTLED:
                return job
            if deadline and time.monotonic() > deadline:
                message = f"job {job_id} still {job['status']} after {timeout:g}s"
                raise ClientError(message, CliExitCode.TIMED_OUT)
            time.sleep(poll)
