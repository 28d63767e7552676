"""`/v1/templates`: every example recipe under examples/, served as written and titled by
its opening comment, each one a recipe `POST /v1/jobs:validate` parses."""

from __future__ import annotations

from api.routes.templates import EXAMPLES_DIR


def test_every_example_is_a_template_with_its_title(client, stack) -> None:
    answer = client.get("/v1/templates", headers=stack.headers("read"))
    assert answer.status_code == 200, answer.text
    templates = {t["name"]: t for t in answer.json()["data"]}
    assert set(templates) == {p.relative_to(EXAMPLES_DIR).as_posix()
                              for p in EXAMPLES_DIR.rglob("*.yaml")}  # fmt: skip
    squad = templates["llm_finetune/tiny_llama_squad.yaml"]
    assert squad["title"].startswith("A tiny Llama")
    assert squad["recipe_yaml"] == (EXAMPLES_DIR / "llm_finetune/tiny_llama_squad.yaml").read_text()


def test_templates_need_a_key(client) -> None:
    assert client.get("/v1/templates").status_code == 401
