"""How the API answers a body it cannot take, and how it sends large answers: a malformed
JSON body says where it broke, an unknown body field gets a "did you mean" among the fields
of the model it sits in, a large list is gzip-compressed for a client that accepts it (one
job is not), and
the OpenAPI document describes `recipe` with the recipe's sections."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def post_raw(client, stack, raw: bytes):
    headers = {**stack.headers(), "Content-Type": "application/json"}
    return client.post("/v1/jobs:validate", content=raw, headers=headers)


def test_malformed_json_says_where_it_broke(client, stack) -> None:
    raw = b'{\n  "name": "x",\n  "recipe": {"a": 1 "b": 2}\n}'
    answer = post_raw(client, stack, raw)
    assert answer.status_code == 422
    (error,) = answer.json()["errors"]
    assert error["loc"] == "body"
    assert error["msg"] == (
        "the body is not valid JSON: Expecting ',' delimiter at line 3, column 21 (character 37)"
    )
    assert error["fix"].startswith("fix the JSON at line 3, column 21")


def test_a_truncated_body_points_at_its_end(client, stack) -> None:
    answer = post_raw(client, stack, b'{"name": "x", "recipe": {')
    (error,) = answer.json()["errors"]
    assert "at line 1, column 26 (character 25)" in error["msg"], error


@pytest.mark.parametrize(
    ("field", "loc", "hint"),
    [
        ({"recipe_yml": "a: 1"}, "recipe_yml", "did you mean 'recipe_yaml'?"),
        ({"resources": {"nproc_per_nod": 2}}, "resources.nproc_per_nod",
         "did you mean 'nproc_per_node'?"),
        ({"labelz": {}}, "labelz", "did you mean 'labels'?"),
        ({"zzz": 1}, "zzz", "remove zzz"),
    ],
)  # fmt: skip
def test_an_unknown_body_field_gets_a_did_you_mean(client, stack, body, field, loc, hint):
    answer = client.post("/v1/jobs:validate", json=body | field, headers=stack.headers())
    assert answer.status_code == 422
    (error,) = answer.json()["errors"]
    assert (error["loc"], error["fix"]) == (loc, hint)
    assert error["msg"].startswith("unknown key")


def test_a_large_list_is_gzipped_for_a_client_that_accepts_it(client, stack, body) -> None:
    for _ in range(3):
        assert client.post("/v1/jobs", json=body, headers=stack.headers()).status_code == 201
    headers = {**stack.headers("read"), "Accept-Encoding": "gzip"}
    answer = client.get("/v1/jobs", params={"limit": 3}, headers=headers)
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in answer.headers["vary"].lower()
    assert len(answer.json()["data"]) == 3  # httpx decoded it
    compressed = int(answer.headers["content-length"])
    assert compressed * 3 < len(answer.content), (compressed, len(answer.content))
    plain = client.get("/v1/jobs", params={"limit": 3},
                       headers={**stack.headers("read"), "Accept-Encoding": "identity"})  # fmt: skip
    assert "content-encoding" not in plain.headers
    assert json.loads(plain.content) == answer.json()


def test_one_job_is_sent_as_is_even_to_a_client_that_accepts_gzip(client, stack, body) -> None:
    """A submit's answer (and a read of one job) is a few KB: compressing it cost the submit
    more CPU than it saves on the wire (`api.main.GZIP_MIN_BYTES`)."""
    from api.main import GZIP_MIN_BYTES

    headers = {**stack.headers(), "Accept-Encoding": "gzip"}
    answer = client.post("/v1/jobs", json=body, headers=headers)
    assert answer.status_code == 201, answer.text
    assert "content-encoding" not in answer.headers
    assert 1024 < len(answer.content) < GZIP_MIN_BYTES  # gzipped under the old 1 KB floor
    read = client.get(f"/v1/jobs/{answer.json()['id']}", headers=headers)
    assert read.status_code == 200
    assert "content-encoding" not in read.headers


def test_a_small_answer_is_sent_as_is(client, stack) -> None:
    headers = {**stack.headers("read"), "Accept-Encoding": "gzip"}
    answer = client.get("/healthz", headers=headers)
    assert "content-encoding" not in answer.headers


@pytest.fixture(scope="module")
def recipe_schema(pg_stack) -> dict:
    from fastapi.testclient import TestClient

    with TestClient(pg_stack.app) as test_client:
        document = test_client.get("/openapi.json").json()
    recipe = document["components"]["schemas"]["JobCreate"]["properties"]["recipe"]
    return next(s for s in recipe["anyOf"] if s.get("type") == "object")


def test_openapi_describes_the_recipe_from_its_sections(recipe_schema) -> None:
    sections = recipe_schema["properties"]
    assert {"step_scheduler", "checkpoint", "peft", "model", "optimizer"} <= set(sections)
    max_steps = sections["step_scheduler"]["properties"]["max_steps"]
    assert max_steps["x-canonical"]["anyOf"][0]["type"] == "integer"
    assert sections["checkpoint"]["properties"]["model_save_format"]["default"] == "safetensors"
    assert "_target_" in sections["optimizer"]["properties"]


AUTOMODEL_FORMS = {
    "step_scheduler": {"max_steps": 10, "val_every_steps": 5, "ckpt_every_steps": 5,
                       "local_batch_size": "none"},
    "checkpoint": {"save_consolidated": "final", "_target_": "x"},
    "peft": None,
    "dist_env": {"backend": "nccl", "timeout_minutes": 1},
    "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": "m", "torch_dtype": "bf16"},
    "loss_fn": {"_target_": "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"},
    "seed": 1,
    "some_automodel_side_section": {"anything": [1, 2]},
}  # fmt: skip


def test_the_documented_recipe_schema_rejects_no_accepted_form(recipe_schema) -> None:
    """Advisory by design: AutoModel's spellings and the shipped examples all pass it."""
    validator = jsonschema.Draft202012Validator(recipe_schema)
    examples = sorted((REPO / "examples").rglob("*.yaml"))
    assert examples
    for recipe in [AUTOMODEL_FORMS, *(yaml.safe_load(p.read_text()) for p in examples)]:
        assert not list(validator.iter_errors(recipe)), recipe
