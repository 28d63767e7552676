"""W&B (offline) and MLflow (local stores) trackers fed by RunLog, read back from their files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from tracker_runs import isolate_trackers, mlflow_history, wandb_payloads, wandb_runs

from jobs.recipe.settings import RecipeSettings
from jobs.recipe.typed import Recipe
from jobs.recipe.validation import validate_job
from trainer.errors import TrainerError
from trainer.metrics import RunLog, TrainRecord, ValRecord
from trainer.trackers import flat_params, open_trackers, store_uri, tracker_metrics

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


@pytest.fixture(autouse=True)
def offline_trackers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing reaches the network or $HOME: W&B offline with its dirs in tmp, no MLflow env."""
    isolate_trackers(tmp_path / "tracker-home", monkeypatch)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


@pytest.fixture
def typed(tiny_dir: Path, tmp_path: Path):
    """A validated recipe on the tiny model, with the given tracker sections."""
    from cli.demo_assets import write_instruction_jsonl

    data = write_instruction_jsonl(tmp_path / "data" / "train.jsonl", 16, seed=0)
    settings = RecipeSettings(home=tmp_path / "home", data_roots=f"{tiny_dir.parent}:{tmp_path}",
                              checkpoint_roots=str(tmp_path))  # fmt: skip

    def make(**sections: Any) -> Recipe:
        recipe = {
            "step_scheduler": {"max_steps": 4, "global_batch_size": 2},
            "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
                      "pretrained_model_name_or_path": str(tiny_dir)},
            "distributed": {"strategy": "ddp"},
            "dataset": {"_target_": "tuneyard.datasets.JsonlInstructionDataset",
                        "path": str(data)},
            "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
            **sections,
        }  # fmt: skip
        result = validate_job(recipe, (), None, settings)
        assert result.valid, [str(e) for e in result.errors]
        return result.typed

    return make


def train_record(step: int) -> TrainRecord:
    return TrainRecord(step, 0, 2.0 / step, 0.5 + step, 1e-3 * step, 0.25, 100.0 * step,
                       50.0 * step, 0.01 * step, 64 * step, 1.0e9 + step)  # fmt: skip


def log_steps(log: RunLog, steps: range, val_at: tuple[int, ...] = ()) -> None:
    for step in steps:
        log.record(train_record(step))
        if step in val_at:
            log.record(ValRecord(step, 0, 1.0 / step, 32, 1.0e9 + step))


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def expected_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """What metrics.jsonl says, under the names trackers log."""
    out: dict[int, dict[str, float]] = {}
    for record in jsonl(run_dir / "metrics.jsonl"):
        out.setdefault(record["step"], {}).update(tracker_metrics(record, record["kind"]))
    return out


def test_tracker_metric_names_are_the_sample_fields() -> None:
    from dataclasses import asdict

    train = tracker_metrics(asdict(train_record(2)), "train")
    assert set(train) == {"epoch", "loss", "grad_norm", "lr", "mem", "tps", "tps_per_rank",
                          "mfu", "num_tokens"}  # fmt: skip
    assert train["loss"] == 1.0 and train["num_tokens"] == 128.0
    val = tracker_metrics(asdict(ValRecord(2, 1, 0.5, 32, 1.0)), "val")
    assert val == {"val_epoch": 1.0, "val_loss": 0.5, "val_num_tokens": 32.0}
    assert "mfu" not in tracker_metrics({**asdict(train_record(1)), "mfu": None}, "train")


def test_wandb_offline_run_holds_every_step_and_value(typed, tmp_path: Path) -> None:
    recipe = typed(wandb={"project": "tuneyard-test", "name": "unit", "tags": ["t1"],
                          "mode": "offline", "dir": "wandb-files"})  # fmt: skip
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=True)
    log.open_trackers(recipe)
    log_steps(log, range(1, 5), val_at=(2, 4))
    log.close()
    (run,) = wandb_runs(run_dir / "wandb-files")
    assert (run.project, run.name, run.tags, run.exit_code) == ("tuneyard-test", "unit", ["t1"], 0)
    assert run.history == expected_history(run_dir)
    assert sorted(run.history) == [1, 2, 3, 4] and run.history[4]["val_loss"] == 0.25
    assert run.history[3]["loss"] == pytest.approx(2.0 / 3)
    assert run.config["step_scheduler"]["max_steps"] == 4 and run.config["wandb"]["dir"]
    assert not (tmp_path / "tracker-home" / "dir" / "wandb").exists()  # the recipe's dir won


def test_a_wandb_file_read_in_the_middle_of_a_write_gives_only_whole_records(typed, tmp_path):
    """The service writes the run file after `finish()`: a reader that catches it mid-write
    sees a record cut short, which must be left for the next read, not parsed."""
    from wandb.proto import wandb_internal_pb2 as pb

    log = RunLog(tmp_path / "run", is_rank0=True)
    log.open_trackers(typed(wandb={"mode": "offline", "dir": "wandb-files"}))
    log_steps(log, range(1, 3))
    log.close()
    wandb_runs(tmp_path / "run" / "wandb-files")
    (path,) = (tmp_path / "run" / "wandb-files").glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    whole = wandb_payloads(data)
    for cut in range(8, len(data), 3):
        found = wandb_payloads(data[:cut])
        assert found == whole[: len(found)]
        for payload in found:
            pb.Record().ParseFromString(payload)


def test_wandb_defaults_to_the_run_dir_and_automodels_run_name(typed, tiny_dir, tmp_path):
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=True)
    log.open_trackers(typed(wandb={"mode": "offline"}))
    log_steps(log, range(1, 3))
    log.event("failed", 2, code="crash")
    log.close()
    (run,) = wandb_runs(run_dir)
    assert run.name == f"{tiny_dir.parent.name}_{tiny_dir.name}" and run.exit_code == 1
    assert sorted(run.history) == [1, 2]


def test_mlflow_file_store_under_the_run_dir(typed, tmp_path: Path) -> None:
    recipe = typed(mlflow={"experiment_name": "unit", "run_name": "r1", "description": "about",
                           "tracking_uri": "file:./mlruns", "tags": {"task": "t"}})  # fmt: skip
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=True)
    log.open_trackers(recipe)
    log_steps(log, range(1, 5), val_at=(2, 4))
    log.close()
    uri = (run_dir / "mlruns").as_uri()
    history = mlflow_history(uri, "unit")
    expected = expected_history(run_dir)
    assert set(history) == {k for values in expected.values() for k in values}
    for key, by_step in history.items():
        assert by_step == {s: v[key] for s, v in expected.items() if key in v}, key
    assert history["val_loss"] == {2: 0.5, 4: 0.25}
    from mlflow.tracking import MlflowClient

    (found,) = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("unit").experiment_id])  # fmt: skip
    assert found.info.status == "FINISHED" and found.info.run_name == "r1"
    assert found.data.tags["task"] == "t" and found.data.tags["mlflow.note.content"] == "about"
    assert found.data.tags["global_batch_size"] == "2"
    assert found.data.params["step_scheduler.max_steps"] == "4"
    assert (run_dir / "mlflow_run_id").read_text() == found.info.run_id


def test_mlflow_defaults_to_a_sqlite_store_in_the_run_dir(typed, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=True)
    log.open_trackers(typed(mlflow={"experiment_name": "default", "flatten_depth": 0}))
    log_steps(log, range(1, 3))
    log.event("preempted", 2, code="preempted")
    log.close()
    uri = store_uri(None, run_dir)
    assert uri == f"sqlite:///{run_dir / 'mlflow.db'}" and (run_dir / "mlflow.db").exists()
    assert mlflow_history(uri, "default")["loss"] == {1: 2.0, 2: 1.0}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("default")
    assert experiment.artifact_location == (run_dir / "mlartifacts").as_uri()
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.status == "KILLED"
    assert json.loads(found.data.params["step_scheduler"])["max_steps"] == 4


def test_a_resumed_job_logs_on_into_its_mlflow_run_unless_resume_is_off(typed, tmp_path):
    run_dir = tmp_path / "run"
    for resume, steps in ((True, range(1, 3)), (True, range(3, 5))):
        log = RunLog(run_dir, is_rank0=True)
        log.open_trackers(typed(mlflow={"experiment_name": "resumed", "resume": resume}))
        log_steps(log, steps)
        log.close()
    uri = store_uri(None, run_dir)
    assert sorted(mlflow_history(uri, "resumed")["loss"]) == [1, 2, 3, 4]
    log = RunLog(run_dir, is_rank0=True)
    log.open_trackers(typed(mlflow={"experiment_name": "resumed", "resume": False}))
    log.close()
    with pytest.raises(AssertionError, match="2 MLflow runs"):
        mlflow_history(uri, "resumed")


def test_only_rank_0_opens_trackers(typed, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=False)
    log.open_trackers(typed(wandb={"mode": "offline"}, mlflow={"experiment_name": "e"}))
    log_steps(log, range(1, 3))
    log.close()
    assert log.trackers == [] and not run_dir.exists()


def test_a_tracker_that_cannot_start_is_one_warning_and_training_goes_on(typed, tmp_path):
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=True)
    recipe = typed(mlflow={"experiment_name": "e", "tracking_uri": "http://127.0.0.1:9"},
                   wandb={"mode": "offline"})  # fmt: skip
    log.open_trackers(recipe)
    log_steps(log, range(1, 4))
    log.close()
    warnings = [e for e in jsonl(run_dir / "events.jsonl") if e["event"] == "tracker_warning"]
    assert [w["tracker"] for w in warnings] == ["mlflow"]
    assert "could not start" in warnings[0]["message"]
    assert [r["step"] for r in jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    (run,) = wandb_runs(run_dir)  # the other tracker still logged every step
    assert sorted(run.history) == [1, 2, 3]


def test_a_tracker_failing_mid_run_warns_once_and_stops_logging(typed, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = RunLog(run_dir, is_rank0=True)
    log.open_trackers(typed(mlflow={"experiment_name": "e", "tracking_uri": "file:mlruns"}))
    log_steps(log, range(1, 3))
    shutil.rmtree(run_dir / "mlruns")  # the store is gone (a disk unmounted)
    log_steps(log, range(3, 6))
    log.close()
    warnings = [e for e in jsonl(run_dir / "events.jsonl") if e["event"] == "tracker_warning"]
    assert len(warnings) == 1 and warnings[0]["step"] == 3
    assert "logging a train record failed" in warnings[0]["message"]
    assert [r["step"] for r in jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert log.trackers == []


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_a_missing_package_is_a_trainer_error_naming_the_install(
    typed, tmp_path, monkeypatch, package
) -> None:
    recipe = typed(**{package: {"mode": "offline"} if package == "wandb" else {"run_name": "r"}})
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    with pytest.raises(TrainerError) as raised:
        open_trackers(recipe, tmp_path, lambda name, message: None)
    assert f"pip install 'tuneyard[{package}]'" in raised.value.message


def test_flat_params_follow_flatten_depth() -> None:
    recipe = {"a": {"b": {"c": 1}}, "d": "x" * 900}
    assert flat_params(recipe, 1) == {"a.b": '{"c": 1}', "d": "x" * 500}
    assert flat_params(recipe, None)["a.b.c"] == "1"
    assert flat_params(recipe, 0)["a"] == '{"b": {"c": 1}}'
    assert flat_params({"e": {}, "f": [1, None]}, None) == {"e": "{}", "f": "[1, null]"}
