"""Property-based run of schemathesis against the app's own OpenAPI: no input makes a 5xx,
and every answer matches what the spec documents for it (status code, content type, body
schema: the error shapes included).

Bounded: a fixed number of derandomized examples per operation and a wall-clock cap on the
whole module (`pytest.mark.timeout`). Run on PostgreSQL, the backend that refuses the most
inputs (NUL characters, oversized integers). Requests carry an admin key, so every
operation is reached past authentication.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]  # fmt: skip
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def api_schema(pg_stack):
    return schemathesis.openapi.from_asgi("/openapi.json", pg_stack.app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_every_answer_matches_its_documented_schema(case, pg_stack) -> None:
    case.call_and_validate(headers=pg_stack.headers("admin"), checks=CHECKS)


def test_operation_ids_read_as_method_names(pg_stack) -> None:
    spec = pg_stack.app.openapi()
    ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {"create_job", "list_jobs", "get_job", "cancel_job", "validate_job",
            "list_job_events", "get_job_metrics", "get_job_logs"} <= ids  # fmt: skip
    assert all(i.isidentifier() and i.islower() for i in ids), sorted(ids)


def test_error_shapes_are_documented_on_every_operation(pg_stack) -> None:
    spec = pg_stack.app.openapi()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert {"400", "413", "422", "500"} <= set(op["responses"]), (method, path)
            body = op["responses"]["422"]["content"]["application/json"]["schema"]
            if "$ref" in body:
                body = spec["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
            assert body["required"] == ["errors"], (method, path, body)
            error = op["responses"]["500"]["content"]["application/json"]["schema"]
            assert error["required"] == ["error"], (method, path)
