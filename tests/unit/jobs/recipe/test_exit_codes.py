"""The exit-code contract's failure record: what a rank writes round-trips, and whatever else
a run directory holds is refused as a value (None), bounded, never raised."""

from __future__ import annotations

import json

import pytest

from jobs.recipe.exit_codes import (
    FIX_MAX,
    MESSAGE_MAX,
    RECORD_NAME,
    ExitCode,
    RankFailure,
    failure_record_name,
    is_user_error,
)

RECORD = RankFailure(1, int(ExitCode.DATA_ERROR), "rows.jsonl:7: bad", "fix it", 4, 1.5e9, 2, 3)


def test_a_record_round_trips_through_json_with_its_code():
    data = json.loads(json.dumps(RECORD.to_json()))
    assert data["code"] == "data_error"
    assert RankFailure.from_json(data) == RECORD
    assert RankFailure.from_json({**data, "attempt": None}).attempt is None


def test_long_texts_are_clipped_both_ways():
    long = RankFailure(0, 1, "m" * 50_000, "f" * 50_000, timestamp=1.0)
    written = long.to_json()
    assert len(written["message"]) == MESSAGE_MAX and len(written["fix"]) == FIX_MAX
    read = RankFailure.from_json({**written, "message": "m" * 50_000, "fix": "f" * 50_000})
    assert read is not None and len(read.message) == MESSAGE_MAX and len(read.fix) == FIX_MAX


@pytest.mark.parametrize(
    "change",
    [
        {"rank": -1},
        {"rank": 2},  # not below world_size
        {"rank": "1"},
        {"rank": True},
        {"exit_code": 0},  # success is not a failure
        {"exit_code": 99},
        {"exit_code": True},
        {"message": None},
        {"message": ["a"]},
        {"fix": 3},
        {"step": -1},
        {"timestamp": float("nan")},
        {"timestamp": "yesterday"},
        {"world_size": 0},
        {"attempt": "1"},
        {"attempt": -1},
    ],
)
def test_a_field_out_of_contract_refuses_the_record(change):
    assert RankFailure.from_json({**RECORD.to_json(), **change}) is None


@pytest.mark.parametrize("data", [None, [], "x", 3, {"rank": 0}, {}])
def test_anything_but_a_record_object_is_none(data):
    assert RankFailure.from_json(data) is None


def test_file_names_match_their_pattern_only():
    assert RECORD_NAME.fullmatch(failure_record_name(0))
    assert RECORD_NAME.fullmatch(failure_record_name(1023))
    for name in ("rank-01.json", "rank-1.json.tmp", ".rank-1.json.77.tmp", "rank-x.json"):
        assert not RECORD_NAME.fullmatch(name)


def test_user_errors_are_the_codes_a_retry_cannot_fix():
    assert is_user_error(ExitCode.DATA_ERROR) and not is_user_error(ExitCode.CRASH)
    assert not is_user_error(1234)
