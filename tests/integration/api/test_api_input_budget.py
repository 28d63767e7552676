"""One input budget per request, on both backends: 200 overrides each an alias bomb cost
one request's worth of value visits (counted by the request's `NodeBudget`, not timed) and
answer a small 422; more than 200 overrides is one error naming `overrides`; names a person
reads back (job name, labels, Idempotency-Key) refuse control characters, naming the field."""

from __future__ import annotations

import pytest

from api import submission
from jobs.recipe.load.bounds import MAX_ERRORS, MAX_NODES, NodeBudget
from jobs.recipe.load.overrides import MAX_OVERRIDES

ENDPOINTS = ["/v1/jobs:validate", "/v1/jobs"]


def alias_bomb(levels: int = 5, width: int = 9) -> str:
    """~170 bytes of flow YAML that expands to 74733 values."""
    lists = [f"&a0 [{','.join(['1'] * width)}]"]
    lists += [f"&a{i} [{','.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"[{','.join(lists)}]"


@pytest.fixture
def budgets(monkeypatch) -> list[NodeBudget]:
    """Every NodeBudget a request makes, to read how many values it visited."""
    made: list[NodeBudget] = []

    class Counted(NodeBudget):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(submission, "NodeBudget", Counted)
    return made


def errors_of(answer) -> list[dict[str, str]]:
    assert answer.status_code == 422, answer.text[:2000]
    return answer.json()["errors"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_200_alias_bomb_overrides_are_one_budget_and_a_small_answer(
    client, stack, body, budgets, path
) -> None:
    bomb = alias_bomb()
    assert len(bomb) < 200
    body["overrides"] = [f"optimizer.extra_{i}={bomb}" for i in range(MAX_OVERRIDES)]
    answer = client.post(path, json=body, headers=stack.headers())
    errors = errors_of(answer)
    assert len(answer.content) < 20_000  # it answered 216 KB
    assert len(budgets) == 1 and budgets[0].visits <= MAX_NODES + MAX_ERRORS  # not 12 M
    assert any(str(MAX_NODES) in e["msg"] for e in errors)


def test_the_recipe_object_is_counted_once(client, stack, body, budgets) -> None:
    body["recipe"]["optimizer"]["betas"] = [0.9, 0.95]
    answer = client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    assert answer.status_code == 200, answer.text
    recipe_values = budgets[0].visits
    body["overrides"] = ["optimizer.betas=[0.9, 0.99]"]
    client.post("/v1/jobs:validate", json=body, headers=stack.headers())
    assert budgets[1].visits == recipe_values + 3  # the override's list and its two numbers


def test_more_than_200_overrides_is_one_error_naming_overrides(client, stack, body) -> None:
    body["overrides"] = ["optimizer.lr=1e-4"] * (MAX_OVERRIDES + 1)
    errors = errors_of(client.post("/v1/jobs", json=body, headers=stack.headers()))
    assert [e["loc"] for e in errors] == ["overrides"]
    assert str(MAX_OVERRIDES) in errors[0]["msg"] and "recipe" in errors[0]["fix"]


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"name": "tiny\x1b[31m"}, "name"),
        ({"name": "tiny\x07"}, "name"),
        ({"name": "tiny\u202egnp.exe"}, "name"),
        ({"name": "tiny\x9b"}, "name"),
        ({"labels": {"team": "nlp\r"}}, "labels.team"),
        ({"labels": {"team": "nlp\u2028"}}, "labels.team"),
    ],
)
def test_names_with_control_characters_are_422_at_their_field(
    client, stack, body, change, loc
) -> None:
    errors = errors_of(client.post("/v1/jobs", json={**body, **change}, headers=stack.headers()))
    assert [e["loc"] for e in errors] == [loc]
    assert "control character" in errors[0]["msg"] and errors[0]["fix"]


def test_a_label_key_with_a_trailing_newline_is_422(client, stack, body) -> None:
    answer = client.post("/v1/jobs", json={**body, "labels": {"team\n": "nlp"}},
                         headers=stack.headers())  # fmt: skip
    (error,) = errors_of(answer)
    assert error["loc"].startswith("labels.team\\n") and "\n" not in error["loc"]


@pytest.mark.parametrize("key", [b"retry\x9b1", b"retry\t1"])
def test_an_idempotency_key_with_a_control_character_is_422(client, stack, body, key) -> None:
    printable = {**body, "name": "llama sft: run #2 (ünïcode)", "labels": {"team/x.y": "nlp ok"}}
    headers = {**stack.headers(), "Idempotency-Key": f"retry-ok-{key[-1]}"}
    assert client.post("/v1/jobs", json=printable, headers=headers).status_code in {200, 201}
    headers = {**stack.headers(), "Idempotency-Key": key}
    errors = errors_of(client.post("/v1/jobs", json=body, headers=headers))
    assert [e["loc"] for e in errors] == ["Idempotency-Key"]
