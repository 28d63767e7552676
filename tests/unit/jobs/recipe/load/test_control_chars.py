"""Names are anchored and printable: a hub id, an override key or a checkpoint step never
matches with a trailing newline; recipe keys hold no control character and string values
only tabs and line breaks; an error names such a character by code point, quotes values
through `shown` and keeps every text short; `escaped` shows them instead of acting."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.errors import FIX_MAX, LOC_MAX, MSG_MAX, QUOTE_MAX, FieldError, shown
from jobs.recipe.load.bounds import check_bounds, escaped, unsafe_char
from jobs.recipe.paths.roots import is_hub_name
from jobs.recipe.paths.scope import STEP_DIR

UNSAFE = ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\x9b", "\u2028", "\u202e", "\u2066"]


def test_a_hub_id_with_a_trailing_newline_is_not_a_hub_id() -> None:
    assert is_hub_name("org/name")
    for name in ["org/name\n", "org/name\r", "org\n/name", "org/na\x1bme"]:
        assert not is_hub_name(name), name


def test_a_step_directory_with_a_trailing_newline_is_not_a_step() -> None:
    assert STEP_DIR.match("step_5") and not STEP_DIR.match("step_5\n")


@pytest.mark.parametrize("char", UNSAFE)
def test_a_key_with_a_control_character_is_refused_at_its_section(char) -> None:
    errors = check_bounds({"wandb": {f"na{char}me": "x"}})
    assert [e.loc for e in errors] == ["wandb"]
    assert f"U+{ord(char):04X}" in errors[0].msg and char not in errors[0].msg


@pytest.mark.parametrize("char", [c for c in UNSAFE if c != "\u2028"])
def test_a_value_with_a_control_character_is_refused_at_its_field(char) -> None:
    errors = check_bounds({"wandb": {"name": f"run{char}[31m"}})
    assert [e.loc for e in errors] == ["wandb.name"] and "control character" in errors[0].msg


def test_a_job_name_from_the_recipe_is_refused_through_validation(validate, recipe) -> None:
    recipe["wandb"] = {"project": "p", "name": "run\x1b]0;pwned\x07"}
    assert "U+001B" in error_at(validate(recipe), "wandb.name").msg


def test_unsafe_char_names_the_first_one_and_free_text_keeps_line_breaks() -> None:
    assert unsafe_char("a\tb") == "\t" and unsafe_char("a\tb", free_text=True) is None
    assert unsafe_char("plain name / with: punctuation") is None
    assert check_bounds({"dataset": {"prompt": "Q:\t{q}\r\nA:\u2028{a}"}}) == []


def test_escaped_shows_each_control_character() -> None:
    assert escaped("\x1b[31mred\x07") == "\\x1b[31mred\\x07"
    assert escaped("a\u202eb\tc\n") == "a\\u202eb\\tc\\n"
    assert escaped("a\tb", keep="\t") == "a\tb" and escaped("plain") == "plain"


def test_shown_cuts_a_long_value_with_an_ellipsis() -> None:
    assert len(shown("x" * 10_000)) == QUOTE_MAX and shown("x" * 10_000).endswith("…")
    assert shown("short") == "'short'"


def test_shown_never_expands_a_shared_value() -> None:
    bomb: list = [1] * 9
    for _ in range(9):
        bomb = [bomb] * 9  # 9**10 values if expanded
    assert len(shown(bomb)) <= QUOTE_MAX


def test_shown_names_a_huge_integer_by_its_size() -> None:
    assert "bits" in shown(10**5000)


def test_a_field_error_keeps_its_texts_short() -> None:
    error = FieldError("k" * 10_000, "m" * 10_000, "f" * 10_000)
    assert (len(error.loc), len(error.msg), len(error.fix)) == (LOC_MAX, MSG_MAX, FIX_MAX)


def test_an_unknown_key_is_quoted_short_and_its_path_escaped(validate, recipe) -> None:
    recipe["step_scheduler"]["x" * 5_000] = 1  # a schema section: schema_errors words it
    result = validate(recipe)
    assert all(len(e.msg) <= MSG_MAX and len(e.loc) <= LOC_MAX for e in result.errors)
    assert any(len(e.msg) < QUOTE_MAX + 40 and "unknown" in e.msg for e in result.errors)
