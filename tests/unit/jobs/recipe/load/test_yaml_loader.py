"""RecipeLoader: YAML 1.1 numbers as people write them, duplicate keys, merge keys, and the
limits it counts while composing (aliases, depth, entries) and the values it refuses."""

from __future__ import annotations

import math
import time

import pytest
import yaml

from jobs.recipe.load.bounds import MAX_DEPTH, MAX_ITEMS, MAX_NODES, Refused
from jobs.recipe.load.yaml_loader import LimitExceeded, load_yaml, parse_scalar


def alias_bomb(levels: int, width: int = 9) -> str:
    """Billion laughs inside `optimizer.betas`: each anchor repeats the previous one."""
    lists = [f"&a0 [{', '.join(['lol'] * width)}]"]
    lists += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"optimizer:\n  lr: 1.0e-3\n  betas: [{', '.join(lists)}]\n"


def limit_error(text: str) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as info:
        load_yaml(text)
    return info.value


@pytest.mark.parametrize(("text", "value"), [("1e-8", 1e-8), ("2E5", 2e5), (".5e-3", 5e-4),
                                             ("1.5", 1.5), ("0x1F", 31), ("1_000", 1000)])  # fmt: skip
def test_numbers_as_people_write_them(text, value) -> None:
    assert load_yaml(f"lr: {text}") == {"lr": value}


def test_a_key_given_twice_is_an_error() -> None:
    with pytest.raises(Exception, match="key 'lr' is given twice"):
        load_yaml("optimizer:\n  lr: 1\n  lr: 2\n")


def test_merge_keys_merge_and_local_keys_override() -> None:
    data = load_yaml(
        "dataset: &ds {path: /data/squad, max_seq_length: 64}\n"
        "validation_dataset:\n  <<: *ds\n  max_seq_length: 32\n"
    )
    assert data["validation_dataset"] == {"path": "/data/squad", "max_seq_length": 32}


def test_merge_of_several_mappings() -> None:
    data = load_yaml("a: &a {x: 1}\nb: &b {y: 2}\nc: {<<: [*a, *b], z: 3}\n")
    assert data["c"] == {"x": 1, "y": 2, "z": 3}


def test_a_local_key_given_twice_beside_a_merge_is_still_an_error() -> None:
    with pytest.raises(Exception, match="given twice"):
        load_yaml("a: &a {x: 1}\nc: {<<: *a, z: 3, z: 4}\n")


def test_modest_aliases_load() -> None:
    data = load_yaml("a: &betas [0.9, 0.95]\nb: {betas: *betas}\nc: {betas: *betas}\n")
    assert data["b"]["betas"] == data["c"]["betas"] == [0.9, 0.95]


def test_an_alias_bomb_stops_counting_fast_at_its_field() -> None:
    text = alias_bomb(8)  # 9**8 values if expanded
    assert len(text) < 1000
    start = time.perf_counter()
    error = limit_error(text).error
    assert time.perf_counter() - start < 5  # expanded, it takes minutes
    assert error.loc.startswith("optimizer.betas.")
    assert str(MAX_NODES) in error.msg


def test_an_alias_of_its_own_collection_is_a_cycle() -> None:
    error = limit_error("model: &m {again: *m}\n").error
    assert error.loc == "model.again"
    assert "cycle" in error.msg


def test_nesting_stops_at_max_depth() -> None:
    error = limit_error("optimizer: {foo: " + "[" * 300 + "]" * 300 + "}\n").error
    assert error.loc.startswith("optimizer.foo.0.0")
    assert len(error.loc.split(".")) == MAX_DEPTH
    assert str(MAX_DEPTH) in error.msg


def test_nesting_up_to_max_depth_loads() -> None:
    depth = MAX_DEPTH - 1  # the recipe mapping itself is the first level
    data = load_yaml("a: " + "[" * depth + "1" + "]" * depth)["a"]
    for _ in range(depth - 1):
        data = data[0]
    assert data == [1]
    assert limit_error("a: " + "[" * (depth + 1) + "1" + "]" * (depth + 1)).error


def test_a_huge_flow_list_is_refused_without_parsing_all_of_it(monkeypatch) -> None:
    from jobs.recipe.load import yaml_loader

    composed = []
    compose = yaml_loader.RecipeLoader.compose_node

    def counting(self, parent, index):
        composed.append(1)
        return compose(self, parent, index)

    monkeypatch.setattr(yaml_loader.RecipeLoader, "compose_node", counting)
    text = "optimizer: {betas: [" + ",".join(["1"] * 330_000) + "]}\n"  # about 660 KB
    error = limit_error(text).error
    assert (error.loc, error.msg) == ("optimizer.betas", f"has more than {MAX_ITEMS} entries")
    assert len(composed) <= MAX_ITEMS + 10  # stopped at the limit, not at the 330,000th


def test_a_mapping_of_too_many_keys_is_refused() -> None:
    text = "data: {" + ", ".join(f"k{i}: 1" for i in range(MAX_ITEMS + 1)) + "}\n"
    assert limit_error(text).error.loc == "data"


@pytest.mark.parametrize(("text", "what", "fix"), [
    ("2024-01-01", "a date or time", "quote it as a string: '2024-01-01'"),
    ("2024-01-01T10:00:00Z", "a date or time", "quote it as a string"),
    ("!!binary aGVsbG8=", "!!binary data", "give the data as a string"),
    ("!!set {a, b}", "a !!set", "write it as a list"),
    ("!!omap [a: 1]", "an ordered mapping (!!omap)", "plain mapping"),
    ("!!pairs [a: 1]", "an ordered mapping (!!pairs)", "plain mapping"),
    ("!!python/object/apply:os.system [ls]", "tagged !!python/object/apply:os.system",
     "remove the tag"),
    ("!custom 5", "tagged !custom", "remove the tag"),
    ("1" * 5000, "an integer of 5000 characters", "give an integer between"),
])  # fmt: skip
def test_values_json_cannot_hold_load_as_refused_markers(text, what, fix) -> None:
    value = load_yaml(f"optimizer: {{weight_decay: {text}}}")["optimizer"]["weight_decay"]
    assert isinstance(value, Refused)
    assert value.what.startswith(what)
    assert fix in value.fix


def test_a_date_key_is_refused_as_a_key() -> None:
    key = next(iter(load_yaml("labels: {2024-01-01: x}")["labels"]))
    assert isinstance(key, Refused)


def test_quoted_and_explicit_strings_stay_strings() -> None:
    data = load_yaml("a: '2024-01-01'\nb: !!str 2024-01-01\nc: !!int '7'\n")
    assert data == {"a": "2024-01-01", "b": "2024-01-01", "c": 7}


def test_nan_and_inf_load_as_floats_for_the_bounds_check() -> None:
    data = load_yaml("a: .nan\nb: .inf\nc: -.inf\nd: 1e400\n")
    assert math.isnan(data["a"]) and data["b"] == data["d"] == math.inf and data["c"] < 0


def test_bad_syntax_is_a_yaml_error_with_a_mark() -> None:
    with pytest.raises(Exception) as info:
        load_yaml("optimizer: [1, 2\n")
    assert info.value.problem_mark.line == 1


@pytest.mark.parametrize(("text", "value"), [("1e-4", 1e-4), ("5", 5), ("true", True),
                                             ("None", None), ("[1, 2]", [1, 2]),
                                             ("a: [", "a: ["), ("hello", "hello")])  # fmt: skip
def test_parse_scalar(text, value) -> None:
    assert parse_scalar(text) == value


def test_parse_scalar_refuses_a_bomb_and_a_date() -> None:
    bomb = parse_scalar("[" + alias_bomb(8).split("betas: [", 1)[1].rstrip())
    assert isinstance(bomb, Refused) and str(MAX_NODES) in bomb.what
    assert isinstance(parse_scalar("2024-01-01"), Refused)


def test_a_lone_surrogate_is_a_yaml_error_not_a_crash() -> None:
    with pytest.raises(yaml.YAMLError, match="surrogate"):
        load_yaml("a: \ud800")
