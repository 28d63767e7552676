"""tuneyard's own app with parts of the submit path taken out, served by
`bench_api_submit.py --variants` beside the full app and the floor: what the rest costs.
Never served outside that benchmark.

- `without_validation`: `api.main`'s app, with the submit's checks
  (`api.submission.check_request`) run on the first request only; every later submit stores
  that answer with its own request body. Auth, the session, the insert and commit, the
  dispatch, the middlewares and the answer stay as they are.
- `without_validation_or_middleware`: the same, and none of tuneyard's middlewares (request
  id, access log, metrics, security headers, gzip, body limit, key-in-URL refusal): the
  route, its dependencies and FastAPI alone.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import api.submission as submission  # noqa: E402
from api.main import create_app  # noqa: E402

_checked: list[submission.Validated] = []
_check_request = submission.check_request


def _first_check(body: Any, *args: Any) -> submission.Validated:
    if not _checked:
        _checked.append(_check_request(body, *args))
    return dataclasses.replace(_checked[0], spec=body.model_dump(mode="json"))


submission.check_request = _first_check
without_validation = create_app()
without_validation_or_middleware = create_app()
without_validation_or_middleware.user_middleware.clear()
