"""Every failure the entry point reports also leaves this rank's failure record, the same
cause as rank 0's `failed` event, written before it (the worker's witness when rank 0 is
stopped first). In this process: `trainer.__main__.main` as a one-rank gloo group."""

from __future__ import annotations

import json

from trainer_harness import Assets, base_recipe

from jobs.recipe.exit_codes import ExitCode, RankFailure


def short_recipe(assets: Assets, **sections) -> dict:
    step = {"max_steps": 2, "val_check_interval": None, "checkpoint_interval": None}
    return base_recipe(assets, step_scheduler=step, lr_scheduler={"warmup_steps": 1}, **sections)


def rank0_record(assets: Assets, name: str) -> RankFailure:
    path = assets.root / "runs" / name / "failures" / "rank-0.json"
    record = RankFailure.from_json(json.loads(path.read_text()))
    assert record is not None
    return record


def test_a_data_error_leaves_the_record_of_the_failed_event(run_main, assets: Assets):
    bad = assets.root / "data" / "bad-record.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "no completion"}\n')
    code, output, events = run_main("record-data", short_recipe(assets, dataset={"path": str(bad)}))
    assert code == ExitCode.DATA_ERROR, output[-2000:]
    record, failed = rank0_record(assets, "record-data"), events[-1]
    assert (record.code, record.message) == (failed["code"], failed["message"])
    assert (record.rank, record.world_size, record.attempt) == (0, 1, None)
    assert record.timestamp <= failed["timestamp"]  # the record first
    assert f"[rank 0] error: {record.message}" in output


def test_an_invalid_recipe_leaves_a_record_too(run_main, assets: Assets):
    code, output, events = run_main("record-invalid", short_recipe(assets, optimizer={"lrr": 1}))
    assert code == ExitCode.INVALID_RECIPE, output[-2000:]
    record = rank0_record(assets, "record-invalid")
    assert record.code == "invalid_recipe" and "optimizer.lrr" in record.message
    assert record.message == events[-1]["message"]
