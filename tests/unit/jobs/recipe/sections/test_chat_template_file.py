"""A dataset's `chat_template` as a file path: read at submit inside the data roots, the
text carried by the job (jobs.recipe.sections.chat_template)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from recipe_asserts import error_at
from sft_fixtures import TOOL_TEMPLATE, chat_rows, write_jsonl

from jobs.recipe.paths.scope import JobScope
from jobs.recipe.sections.chat_template import TEMPLATE_FILE_MAX
from jobs.recipe.typed import Recipe
from jobs.recipe.validation import validate_job

CHAT = "nemo_automodel.components.datasets.llm.chat_dataset.ChatDataset"


@pytest.fixture
def chat_recipe(recipe, data_root):
    rows = write_jsonl(data_root / "chat" / "train.jsonl", chat_rows(6))
    recipe["dataset"] = {"_target_": CHAT, "path_or_dataset_id": str(rows), "seq_length": 64}
    return recipe


def _with_template(recipe, value: str, section: str = "dataset"):
    if section not in recipe:
        recipe[section] = dict(recipe["dataset"])
    recipe[section]["chat_template"] = value
    return recipe


def test_a_template_file_in_the_data_roots_becomes_its_text(validate, chat_recipe, data_root):
    template = data_root / "templates" / "chat_template.jinja"
    template.parent.mkdir()
    template.write_text(TOOL_TEMPLATE)
    for section in ("dataset", "validation_dataset"):
        _with_template(chat_recipe, str(template), section)
    result = validate(chat_recipe)
    assert result.valid, [str(e) for e in result.errors]
    for section in ("dataset", "validation_dataset"):
        assert result.recipe[section]["chat_template"] == TOOL_TEMPLATE
        note = next(w.msg for w in result.warnings if w.loc == f"{section}.chat_template")
        assert str(template) in note and "a later edit of the file does not reach it" in note
    assert Recipe.from_json(result.recipe).dataset.kwargs["chat_template"] == TOOL_TEMPLATE


def test_the_stored_job_needs_the_file_no_more(validate, chat_recipe, data_root, settings):
    template = data_root / "tpl.jinja"
    template.write_text(TOOL_TEMPLATE)
    stored = validate(_with_template(chat_recipe, str(template))).recipe
    template.unlink()
    again = validate_job(stored, (), None, settings)
    assert again.valid, [str(e) for e in again.errors]
    assert again.recipe["dataset"]["chat_template"] == TOOL_TEMPLATE


def test_a_tokenizer_config_gives_its_chat_template(validate, chat_recipe, data_root):
    """AutoModel reads a JSON file's `chat_template` key, as in tokenizer_config.json."""
    config = data_root / "tokenizer_config.json"
    config.write_text(json.dumps({"model_max_length": 512, "chat_template": TOOL_TEMPLATE}))
    result = validate(_with_template(chat_recipe, str(config)))
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["dataset"]["chat_template"] == TOOL_TEMPLATE


def test_a_relative_path_is_read_from_the_working_directory_inside_the_roots(
    validate, chat_recipe, data_root, monkeypatch
):
    (data_root / "examples").mkdir()
    (data_root / "examples" / "t.jinja").write_text(TOOL_TEMPLATE)
    monkeypatch.chdir(data_root)
    result = validate(_with_template(chat_recipe, "examples/t.jinja"))
    assert result.valid, [str(e) for e in result.errors]


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda root, tmp: str(root / "missing.jinja"), "does not exist"),
        (lambda root, tmp: str(_write(tmp / "elsewhere" / "t.jinja", TOOL_TEMPLATE)),
         "outside the allowed roots"),
        (lambda root, tmp: str(root / ".." / "elsewhere" / "t.jinja"), "escapes the allowed roots"),
        (lambda root, tmp: str(root), "not a regular file"),
        (lambda root, tmp: str(_write(root / "big.jinja", "{{ x }}" * TEMPLATE_FILE_MAX)),
         f"over the {TEMPLATE_FILE_MAX} bytes validation reads"),
        (lambda root, tmp: str(_write(root / "latin1.jinja", b"{{ \xe9 }}")), "not UTF-8 text"),
        (lambda root, tmp: str(_write(root / "plain.txt", "chatml")), "holds no Jinja template"),
        (lambda root, tmp: str(_write(root / "named.json", json.dumps(
            {"chat_template": [{"name": "default", "template": "{{ x }}"}]}))),
         "not one template text"),
        (lambda root, tmp: "chatml", "outside the allowed roots"),  # a path from the cwd
    ],
)  # fmt: skip
def test_a_template_path_that_cannot_be_read_is_one_error_at_its_field(
    validate, chat_recipe, data_root, tmp_path, make, words
):
    result = validate(_with_template(chat_recipe, make(data_root, tmp_path)))
    errors = [e for e in result.errors if e.loc == "dataset.chat_template"]
    assert len(errors) == 1 and words in errors[0].msg, [str(e) for e in result.errors]


def test_a_symlink_in_the_roots_to_a_template_outside_is_refused(
    validate, chat_recipe, data_root, tmp_path
):
    outside = _write(tmp_path / "secret" / "t.jinja", TOOL_TEMPLATE)
    link = data_root / "t.jinja"
    os.symlink(outside, link)
    error = error_at(validate(_with_template(chat_recipe, str(link))), "dataset.chat_template")
    assert "symlink that leads outside the allowed roots" in error.msg


def test_a_template_in_another_projects_run_is_refused(chat_recipe, settings, ckpt_root):
    """The server's data roots may hold the runs directory; another project's run is not
    readable, whether or not the file exists."""
    shared = settings.model_copy(update={"data_roots": f"{settings.data_roots}:{ckpt_root}"})
    template = _write(ckpt_root / "runs" / "job-of-b" / "t.jinja", TOOL_TEMPLATE)
    scope = JobScope("a", owns_job=lambda job: job == "job-of-a")
    result = validate_job(_with_template(chat_recipe, str(template)), (), None, shared, scope=scope)
    assert "not in project a" in error_at(result, "dataset.chat_template").msg


def test_make_squad_dataset_takes_a_template_file_too(validate, recipe, data_root):
    """AutoModel's make_squad_dataset takes `chat_template` (the OLMo SQuAD recipes)."""
    template = data_root / "olmo.jinja"
    template.write_text(TOOL_TEMPLATE)
    recipe["dataset"]["_target_"] = (
        "nemo_automodel.components.datasets.llm.squad.make_squad_dataset"
    )
    result = validate(_with_template(recipe, str(template)))
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["dataset"]["chat_template"] == TOOL_TEMPLATE
    not_jinja = validate(_with_template(recipe, "plain words"))
    assert error_at(not_jinja, "dataset.chat_template")
