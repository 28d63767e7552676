"""Every error path answers its status with the stable JSON shape."""

from __future__ import annotations

import uuid

import pytest


def test_missing_and_unknown_keys_are_401(client) -> None:
    for headers in ({}, {"Authorization": "Bearer ty_not-a-key"}, {"Authorization": "Basic x"}):
        answer = client.get("/v1/jobs", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthorized"
        assert answer.headers["www-authenticate"] == "Bearer"


def test_revoked_key_is_401(client, stack) -> None:
    from jobs.store.api_keys import create_api_key, revoke_api_key

    with stack.session() as s:
        key, raw = create_api_key(s, stack.project, "read")
        s.commit()
        revoke_api_key(s, key.id)
        s.commit()
    answer = client.get("/v1/jobs", headers={"Authorization": f"Bearer {raw}"})
    assert answer.status_code == 401


@pytest.mark.parametrize(("method", "path"), [
    ("post", "/v1/jobs"), ("post", "/v1/jobs:validate"), ("post", "/v1/keys"),
    ("post", "/v1/jobs/{id}/cancel"), ("post", "/v1/jobs/{id}/pause"),
    ("post", "/v1/jobs/{id}/resume"),
])  # fmt: skip
def test_read_keys_cannot_write(client, stack, body, method, path) -> None:
    job_id = client.post("/v1/jobs", json=body, headers=stack.headers()).json()["id"]
    answer = client.request(method.upper(), path.format(id=job_id), json=body,
                            headers=stack.headers("read"))  # fmt: skip
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "forbidden"


def test_submit_keys_cannot_create_keys(client, stack) -> None:
    answer = client.post("/v1/keys", json={"role": "read"}, headers=stack.headers("submit"))
    assert answer.status_code == 403


@pytest.mark.parametrize("suffix", ["", "/events", "/metrics", "/metrics/stream", "/logs",
                                    "/checkpoints", "/cancel", "/pause", "/resume"])  # fmt: skip
def test_another_projects_job_is_404(client, stack, body, suffix) -> None:
    job_id = client.post("/v1/jobs", json=body, headers=stack.headers()).json()["id"]
    method = "POST" if suffix in {"/cancel", "/pause", "/resume"} else "GET"
    answer = client.request(method, f"/v1/jobs/{job_id}{suffix}", headers=stack.headers("other"))
    assert answer.status_code == 404
    assert answer.json()["error"] == {"code": "not_found", "message": f"job {job_id} not found"}
    listed = client.get("/v1/jobs", headers=stack.headers("other")).json()["data"]
    assert job_id not in {j["id"] for j in listed}


@pytest.mark.parametrize("job_id", [str(uuid.uuid4()), "not-a-uuid", "%00"])
def test_unknown_job_is_404(client, stack, job_id) -> None:
    answer = client.get(f"/v1/jobs/{job_id}", headers=stack.headers("read"))
    assert answer.status_code == 404


def _locs(answer) -> list[str]:
    assert answer.status_code == 422, answer.text
    errors = answer.json()["errors"]
    assert all(set(e) == {"loc", "msg", "fix"} for e in errors)
    return [e["loc"] for e in errors]


def test_recipe_errors_are_422_at_the_recipe_field(client, stack, body) -> None:
    body["recipe"]["optimizer"]["lr"] = "fast"
    assert "optimizer.lr" in _locs(client.post("/v1/jobs", json=body, headers=stack.headers()))
    assert "optimizer.lr" in _locs(
        client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    )


def test_override_errors_are_422(client, stack, body) -> None:
    body["overrides"] = ["optimizer.lr=fast"]
    answer = client.post("/v1/jobs", json=body, headers=stack.headers())
    assert "optimizer.lr" in _locs(answer)
    assert "override" in answer.json()["errors"][0]["msg"]


@pytest.mark.parametrize(("patch", "loc"), [
    ({"resources": {"nproc_per_node": 0}}, "resources.nproc_per_node"),
    ({"resources": {"nproc_per_nod": 2}}, "resources.nproc_per_nod"),
    ({"resources": {"accelerator": "tpu"}}, "resources.accelerator"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"labels": {"bad key!": "x"}}, "labels.bad key!.[key]"),
    ({"name": ""}, "name"),
    ({"recipe_yaml": "a: 1\n"}, "recipe"),
    ({"recipe": None}, "recipe"),
    ({"name": "nul\u0000name"}, "name"),
    ({"surprise": 1}, "surprise"),
])  # fmt: skip
def test_body_errors_are_422_at_the_body_field(client, stack, body, patch, loc) -> None:
    body.update(patch)
    assert loc in _locs(client.post("/v1/jobs", json=body, headers=stack.headers()))


def test_yaml_syntax_error_is_422(client, stack) -> None:
    answer = client.post("/v1/jobs", json={"recipe_yaml": "model: [unclosed\n"},
                         headers=stack.headers())  # fmt: skip
    assert _locs(answer) == ["<recipe>"]


def test_one_line_yaml_is_never_read_as_a_server_path(client, stack, tmp_path) -> None:
    secret = tmp_path / "secret.yaml"
    secret.write_text("model: {pretrained_model_name_or_path: leaked}\n")
    answer = client.post("/v1/jobs", json={"recipe_yaml": str(secret)}, headers=stack.headers())
    assert answer.status_code == 422 and "leaked" not in answer.text


def test_bad_query_parameters_are_422(client, stack) -> None:
    headers = stack.headers("read")
    assert _locs(client.get("/v1/jobs", params={"limit": 0}, headers=headers)) == ["limit"]
    assert _locs(client.get("/v1/jobs", params={"status": "done"}, headers=headers)) == ["status.0"]
    assert _locs(client.get("/v1/jobs", params={"cursor": "zzz"}, headers=headers)) == ["cursor"]
    assert _locs(client.get("/v1/jobs", params={"label": "nokey"}, headers=headers)) == ["label"]


def test_unknown_route_and_method_use_the_error_shape(client, stack) -> None:
    assert client.get("/v1/nothing", headers=stack.headers()).json()["error"]["code"] == "not_found"
    answer = client.delete("/v1/jobs", headers=stack.headers())
    assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"
