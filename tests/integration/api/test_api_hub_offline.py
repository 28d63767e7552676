"""An offline server (HF_HUB_OFFLINE=1, as the test session runs) refuses uncached hub names."""

from __future__ import annotations

import copy

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
