"""Property-based run of schemathesis against the app's own OpenAPI: no input makes a 5xx.

Bounded (a fixed number of examples per operation, no shrinking beyond Hypothesis' default
deadline-free settings) and run on PostgreSQL, the backend that refuses the most inputs
(NUL characters, oversized integers). Requests carry an admin key, so every operation is
reached past authentication.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 25


@pytest.fixture
def api_schema(pg_stack):
    return schemathesis.openapi.from_asgi("/openapi.json", pg_stack.app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_no_input_makes_a_server_error(case, pg_stack) -> None:
    case.call_and_validate(headers=pg_stack.headers("admin"), checks=[not_a_server_error])
