"""Health, readiness, Prometheus metrics, the model registry, key creation, auth-off mode."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from jobs.store.api_keys import create_api_key, revoke_api_key


def test_healthz(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}


def test_readyz_checks_database_and_redis(client) -> None:
    answer = client.get("/readyz")
    assert answer.status_code == 200
    assert answer.json()["checks"] == {"database": "ok", "broker": "ok", "broker_client": "ok"}


def test_start_up_objects_are_frozen_while_serving(stack) -> None:
    import gc

    gc.unfreeze()
    before = gc.get_threshold()
    with TestClient(create_app(stack.settings)) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 10_000  # modules, routes, the broker client
        assert gc.get_threshold() == before  # the collector's own thresholds
    assert gc.get_freeze_count() == 0  # handed back at shutdown


def test_readyz_is_503_when_the_broker_is_down(stack) -> None:
    settings = stack.settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/1"})
    with TestClient(create_app(settings)) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["checks"]["broker"].startswith("unreachable")
    assert answer.json()["checks"]["broker_client"].startswith("unreachable at start-up")


def test_readyz_is_503_when_the_database_is_down(stack, tmp_path) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"
    settings = stack.settings.model_copy(update={"database_url": url})
    with TestClient(create_app(settings)) as client:
        answer = client.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["checks"]["database"].startswith("unreachable")
        assert "tuneyard_database_up 0" in client.get("/metrics").text


def test_readyz_embedded_broker(stack, tmp_path) -> None:
    settings = stack.settings.model_copy(update={"broker_url": None, "home": tmp_path})
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").json()["checks"]["broker"] == "ok"


def test_prometheus_text(client, stack, body) -> None:
    client.post("/v1/jobs", json=body, headers=stack.headers())
    client.get("/v1/jobs", headers=stack.headers("read"))
    text = client.get("/metrics").text
    assert 'tuneyard_http_requests_total{method="POST",route="/v1/jobs",status="201"}' in text
    assert (
        'tuneyard_http_request_duration_seconds_bucket{le="+Inf",method="GET",route="/v1/jobs"}'
        in text
    )
    assert 'tuneyard_queue_depth{queue="cpu"}' in text
    assert 'tuneyard_broker_messages{queue="cpu"}' in text
    # No project's data without an admin key: not open, not to a read key.
    assert "tuneyard_project_jobs" not in text and stack.project not in text
    read = client.get("/metrics", headers=stack.headers("read")).text
    assert "tuneyard_project_jobs" not in read
    admin = client.get("/metrics", headers=stack.headers("admin")).text
    assert f'tuneyard_project_jobs{{project="{stack.project}",state="queued"}}' in admin
    assert stack.project + "-other" not in admin


def test_models_lists_the_registry(client, stack) -> None:
    data = client.get("/v1/models", headers=stack.headers("read")).json()["data"]
    llama = next(m for m in data if m["architecture"] == "LlamaForCausalLM")
    assert llama["capabilities"]["supports_tp"] is True and llama["family"] == "llama"
    assert client.get("/v1/models").status_code == 401


def test_admin_creates_keys_for_its_project(client, stack, body) -> None:
    answer = client.post("/v1/keys", json={"role": "read"}, headers=stack.headers("admin"))
    assert answer.status_code == 201
    created = answer.json()
    assert created["project"] == stack.project and created["key"].startswith(created["prefix"])
    new_key = {"Authorization": f"Bearer {created['key']}"}
    assert client.get("/v1/jobs", headers=new_key).status_code == 200
    assert client.post("/v1/jobs", json=body, headers=new_key).status_code == 403
    bad = client.post("/v1/keys", json={"role": "root"}, headers=stack.headers("admin"))
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == "role"


def test_auth_off_uses_the_default_project_and_says_so(stack, body, caplog) -> None:
    settings = stack.settings.model_copy(update={"auth": "off"})
    with caplog.at_level(logging.WARNING, "tuneyard.api"), TestClient(create_app(settings)) as c:
        answer = c.post("/v1/jobs", json=body)
        assert answer.status_code == 201 and answer.json()["project"] == "default"
        assert c.get(f"/v1/jobs/{answer.json()['id']}").status_code == 200
    assert any("TUNEYARD_AUTH=off" in r.message for r in caplog.records)


def test_openapi_documents_every_route(client) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs:validate", "/v1/jobs/{job_id}/metrics/stream", "/readyz",
            "/v1/models", "/metrics"} <= set(spec["paths"])  # fmt: skip
    post = spec["paths"]["/v1/jobs"]["post"]
    assert {"200", "201", "401", "403", "409", "422"} <= set(post["responses"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    # Submit and validate read the header themselves; the spec still names the scheme.
    for path in ("/v1/jobs", "/v1/jobs:validate"):
        assert spec["paths"][path]["post"]["security"] == [{"HTTPBearer": []}]


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer ", "Basic dXNlcjpwdw==", "Token x",
                                    " Bearer x", "Bearerx"])  # fmt: skip
def test_submit_refuses_what_is_not_a_bearer_key(client, stack, body, header) -> None:
    answer = client.post("/v1/jobs", json=body, headers={"Authorization": header})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("form", ["bearer {}", "BEARER {}", "Bearer   {}  "])
def test_submit_reads_the_bearer_scheme_as_http_says(client, stack, body, form) -> None:
    """The scheme is case-insensitive and the key's surrounding blanks are not part of it."""
    key = stack.headers()["Authorization"].removeprefix("Bearer ")
    answer = client.post("/v1/jobs:validate", json=body,
                         headers={"Authorization": form.format(key)})  # fmt: skip
    assert answer.status_code == 200, answer.text


def test_submit_resolves_its_key_inside_the_route(client, stack, body) -> None:
    """Submit and validate look the key up in their own threadpool call: a missing key is
    401 before the body is read, an unknown or revoked one 401, a read key 403, and none of
    them stores a job."""
    before = client.get("/v1/jobs", headers=stack.headers("read")).json()["data"]
    for path in ("/v1/jobs", "/v1/jobs:validate"):
        assert client.post(path, json={"recipe": 3}).status_code == 401  # no key, bad body
        unknown = client.post(path, json=body, headers={"Authorization": "Bearer ty_nope"})
        assert unknown.status_code == 401 and "unknown or revoked" in unknown.text
        basic = client.post(path, json=body, headers={"Authorization": "Basic eDp5"})
        assert basic.status_code == 401
        assert client.post(path, json=body, headers=stack.headers("read")).status_code == 403
    with stack.session() as session:
        row, raw = create_api_key(session, stack.project, "submit")
        assert revoke_api_key(session, row.id)
        session.commit()
    gone = client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {raw}"})
    assert gone.status_code == 401
    assert client.get("/v1/jobs", headers=stack.headers("read")).json()["data"] == before


def test_sync_routes_run_on_the_configured_number_of_threads(stack) -> None:
    import anyio.to_thread

    settings = stack.settings.model_copy(update={"api_threads": 3})
    with TestClient(create_app(settings)) as client:
        limiter = client.portal.call(anyio.to_thread.current_default_thread_limiter)
        assert limiter.total_tokens == 3


def test_uvicorn_parses_http_with_httptools() -> None:
    """A declared dependency: uvicorn's `auto` picks its C parser only when importable."""
    from uvicorn.config import Config

    config = Config("api.main:app", log_config=None)
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
