"""The engine's JSON column codec: orjson, with the standard library for what orjson refuses."""

from __future__ import annotations

import json

from jobs.store.engine import json_text, json_value


def test_round_trips_what_the_standard_library_would():
    value = {"recipe": {"optimizer": {"lr": 1e-4, "betas": [0.9, 0.95]}, "name": "é\u2603"},
             "n": 2**63 - 1, "none": None, "t": (1, 2), "flag": True}  # fmt: skip
    assert json_value(json_text(value)) == json.loads(json.dumps(value))


def test_keys_of_other_types_are_written_as_text_as_the_standard_library_does():
    assert json_value(json_text({3: "a", 2.5: "b", False: "c", None: "d"})) == {
        "3": "a", "2.5": "b", "false": "c", "null": "d",
    }  # fmt: skip


def test_what_orjson_refuses_is_written_and_read_by_the_standard_library():
    assert json.loads(json_text({"big": 2**70})) == {"big": 2**70}
    mixed = {1: "a", "b": 2}
    assert json_value(json_text(mixed)) == {"1": "a", "b": 2}
    assert json_value('{"loss": NaN}')["loss"] != json_value('{"loss": NaN}')["loss"]
