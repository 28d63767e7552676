"""Hub names at the API: an offline server (HF_HUB_OFFLINE=1, as the test session runs) refuses
uncached ones; an online one fetches a hub model's config and pins its commit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

HELLASWAG = "nemo_automodel.components.datasets.llm.hellaswag.HellaSwag"


def test_an_uncached_hub_dataset_is_refused_at_its_field(client, stack, body):
    assert stack.settings.hub_offline  # read from HF_HUB_OFFLINE at start-up
    body = copy.deepcopy(body)
    body["recipe"]["dataset"] = {"_target_": HELLASWAG, "path_or_dataset": "rowan/hellaswag"}
    answer = client.post("/v1/jobs", json=body, headers=stack.headers("submit"))
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["loc"] == "dataset.path_or_dataset"
    assert "server is offline" in error["msg"] and "hf download" in error["fix"]


def test_an_online_server_accepts_it_for_the_worker(client, stack, body):
    body = copy.deepcopy(body)
    body["recipe"]["dataset"] = {"_target_": HELLASWAG, "path_or_dataset": "rowan/hellaswag"}
    stack.settings.hub_offline = False
    try:
        answer = client.post("/v1/jobs:validate", json=body, headers=stack.headers("submit"))
    finally:
        stack.settings.hub_offline = True
    assert answer.status_code == 200, answer.text


def test_an_online_server_fetches_a_hub_models_config_and_pins_its_commit(
    client, stack, body, tmp_path, monkeypatch
):
    import huggingface_hub.constants
    from hub_server import repo_commit, serve_hub, write_repo

    # The same tiny Llama the body's local model directory holds, now published on the hub.
    local = Path(body["recipe"]["model"]["pretrained_model_name_or_path"])
    config = json.loads((local / "config.json").read_text())
    repo = write_repo(tmp_path / "hub", "org/hub-llama", {"config.json": config})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "api-cache"))
    body = copy.deepcopy(body)
    body["recipe"]["model"]["pretrained_model_name_or_path"] = "org/hub-llama"
    stack.settings.hub_offline, stack.settings.hub_fetch = False, True
    try:
        with serve_hub(tmp_path / "hub") as endpoint:
            monkeypatch.setenv("HF_ENDPOINT", endpoint)
            answer = client.post("/v1/jobs", json=body, headers=stack.headers("submit"))
    finally:
        stack.settings.hub_offline = True
    assert answer.status_code == 201, answer.text
    plan = answer.json()["plan"]
    assert plan["architecture"] == "LlamaForCausalLM"
    assert plan["hub_revisions"] == {"org/hub-llama": repo_commit(repo)}
