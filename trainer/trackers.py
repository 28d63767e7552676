"""Experiment trackers rank 0 logs to besides `metrics.jsonl`: Weights & Biases and MLflow.

A recipe's `wandb:` / `mlflow:` section (`jobs.recipe.sections.trackers`) opens one tracker each on
rank 0 (`open_trackers`); `trainer.metrics.RunLog` hands it every train and validation
record it writes (it passes on the train records of every `log_remote_every_steps`-th
step) and finishes it with the run's outcome. The packages are optional and imported
here, inside the tracker, only when a recipe asks for one: a missing package is a
`TrainerError` (submit refuses such a job, so it means a worker installed differently).
A tracker is never allowed to stop training: the first error it raises at start or while
logging (a tracking server down, a full disk) becomes one `tracker_warning` event and the
tracker is dropped for the rest of the run; `metrics.jsonl` still has every step. Paths
the recipe leaves relative are resolved against the run directory, where validation
promised they would go.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.metrics_sample import MetricKind, fields_of
from jobs.recipe.sections.trackers import Mlflow, Wandb
from jobs.recipe.typed import Recipe
from trainer.errors import TrainerError

FINISHED, FAILED, KILLED = "finished", "failed", "killed"
MLFLOW_STATUS = {FINISHED: "FINISHED", FAILED: "FAILED", KILLED: "KILLED"}
WANDB_EXIT = {FINISHED: 0, FAILED: 1, KILLED: int(ExitCode.PREEMPTED)}
RUN_ID_FILE = "mlflow_run_id"  # in the run dir: a resumed job logs on into the same run
PARAM_CHARS = 500  # MLflow servers older than 2.x refuse longer param values
# A dead tracking server must not hold a step for minutes of retries (unless the worker
# chose its own values).
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}

Warn = Callable[[str, str], None]  # (tracker name, message)


class Tracker(Protocol):
    name: str

    def log_train(self, record: dict[str, Any]) -> None: ...

    def log_val(self, record: dict[str, Any]) -> None: ...

    def finish(self, status: str) -> None: ...


def tracker_metrics(record: dict[str, Any], kind: MetricKind) -> dict[str, float]:
    """A record's numbers under the names trackers chart: the MetricsSample field names,
    with `val_` in front of a validation record's (`val_loss`, `val_num_tokens`)."""
    out: dict[str, float] = {}
    for name in fields_of(kind):
        value = record.get(name)
        if name in ("step", "timestamp") or value is None:
            continue
        key = name if kind == "train" or name.startswith("val_") else f"val_{name}"
        out[key] = float(value)
    return out


def _require(package: str, section: str) -> Any:
    try:
        if package == "wandb":
            import wandb

            return wandb
        import mlflow

        return mlflow
    except ImportError as exc:
        raise TrainerError(
            ExitCode.UNSUPPORTED,
            f"the recipe's {section}: section needs the {package} package, which this worker "
            f"lacks ({exc}); install it with pip install 'tuneyard[{section}]'",
        ) from None


def under_run_dir(path: str, run_dir: Path) -> Path:
    """A path validation checked: relative ones are inside the run directory."""
    raw = Path(path).expanduser()
    return raw if raw.is_absolute() else run_dir / raw


def model_name(recipe: Recipe) -> str | None:
    return recipe.model_source


class WandbTracker:
    """One W&B run: the typed recipe as its config, one `run.log` per record at its step."""

    name = "wandb"

    def __init__(self, section: Wandb, recipe: Recipe, run_dir: Path):
        wandb = _require("wandb", "wandb")
        directory = under_run_dir(section.dir or section.save_dir or ".", run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        name = section.name or None
        if name is None and model_name(recipe):  # AutoModel's run name: the model's last parts
            name = "_".join(str(model_name(recipe)).split("/")[-2:])
        given = {
            "project": section.project,
            "entity": section.entity,
            "group": section.group,
            "job_type": section.job_type,
            "notes": section.notes,
            "tags": list(section.tags) or None,
            "mode": section.mode,
            "id": section.id,
            "resume": section.resume,
        }
        self.run = wandb.init(
            dir=str(directory),
            name=name,
            config=recipe.to_json(),
            settings=wandb.Settings(silent=True, console="off"),
            **{k: v for k, v in given.items() if v is not None},
        )

    def log_train(self, record: dict[str, Any]) -> None:
        self.run.log(tracker_metrics(record, "train"), step=int(record["step"]))

    def log_val(self, record: dict[str, Any]) -> None:
        self.run.log(tracker_metrics(record, "val"), step=int(record["step"]))

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=WANDB_EXIT[status])


def store_uri(tracking_uri: str | None, run_dir: Path) -> str:
    """The tracking store: the recipe's, else the worker's MLFLOW_TRACKING_URI, else a
    sqlite database in the run directory (MLflow's own default, kept inside the job)."""
    if tracking_uri is None:
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir / 'mlflow.db'}"
    if tracking_uri.startswith("sqlite:///"):
        return f"sqlite:///{under_run_dir(tracking_uri[len('sqlite:///') :], run_dir)}"
    if tracking_uri.startswith("file:"):
        return file_uri(tracking_uri, run_dir)
    return tracking_uri


def file_uri(uri: str, run_dir: Path) -> str:
    """`file:<path>` as validation stored it, relative paths put under the run directory."""
    parts = urlsplit(uri)
    raw = unquote(parts.path if uri[5:].startswith("//") else uri[5:])
    return under_run_dir(raw, run_dir).resolve().as_uri()


def artifact_uri(section: Mlflow, store: str, run_dir: Path) -> str | None:
    """Where a new experiment keeps artifacts. A sqlite store would default to ./mlruns of
    the trainer's working directory, so its artifacts go next to the database instead."""
    location = section.artifact_location  # validation wrote local paths as file:<path>
    if location is not None:
        return file_uri(location, run_dir) if location.startswith("file:") else location
    if store.startswith("sqlite:///"):
        return (Path(store[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    return None


def flat_params(value: dict[str, Any], depth: int | None, prefix: str = "") -> dict[str, str]:
    """The recipe as MLflow params: nested keys joined with '.' down to `depth` levels
    (None: all the way), deeper mappings and lists written as JSON."""
    out: dict[str, str] = {}
    for key, inner in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(inner, dict) and inner and (depth is None or depth > 0):
            out.update(flat_params(inner, None if depth is None else depth - 1, name))
        else:
            text = json.dumps(inner) if isinstance(inner, dict | list) else str(inner)
            out[name] = text[:PARAM_CHARS]
    return out


class MlflowTracker:
    """One MLflow run through `MlflowClient` (no process-global active run): the recipe as
    params, one `log_batch` per record at its step, ended with the run's outcome."""

    name = "mlflow"

    def __init__(self, section: Mlflow, recipe: Recipe, run_dir: Path):
        mlflow = _require("mlflow", "mlflow")
        for var, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(var, value)
        store = store_uri(section.tracking_uri, run_dir)
        if store.startswith("file:"):  # the recipe chose MLflow's older file store on purpose
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.tracking.MlflowClient(tracking_uri=store)
        self._entities = mlflow.entities
        experiment_id = self._experiment(section, store, run_dir)
        self.run_id = self._run(section, recipe, experiment_id, run_dir)

    def _experiment(self, section: Mlflow, store: str, run_dir: Path) -> str:
        found = self.client.get_experiment_by_name(section.experiment_name)
        if found is not None:
            return found.experiment_id
        location = artifact_uri(section, store, run_dir)
        try:
            return self.client.create_experiment(section.experiment_name, location)
        except Exception:  # another job created it a moment ago
            found = self.client.get_experiment_by_name(section.experiment_name)
            if found is None:
                raise
            return found.experiment_id

    def _run(self, section: Mlflow, recipe: Recipe, experiment_id: str, run_dir: Path) -> str:
        sidecar = run_dir / RUN_ID_FILE
        if section.resume and sidecar.exists():
            run_id = sidecar.read_text().strip()
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        schedule = recipe.step_scheduler
        tags = {
            **({"model": model_name(recipe)} if model_name(recipe) else {}),
            "global_batch_size": str(schedule.global_batch_size),
            "local_batch_size": str(schedule.local_batch_size),
            **section.tags,
        }
        if section.description is not None:
            tags["mlflow.note.content"] = section.description
        run = self.client.create_run(experiment_id, run_name=section.run_name or None, tags=tags)
        run_id = run.info.run_id
        sidecar.write_text(run_id)
        params = flat_params(recipe.to_json(), section.flatten_depth)
        entries = [self._entities.Param(k, v) for k, v in params.items()]
        self.client.log_batch(run_id, params=entries)
        return run_id

    def _log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._entities.Metric(k, v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_train(self, record: dict[str, Any]) -> None:
        self._log(tracker_metrics(record, "train"), int(record["step"]))

    def log_val(self, record: dict[str, Any]) -> None:
        self._log(tracker_metrics(record, "val"), int(record["step"]))

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, MLFLOW_STATUS[status])


class GuardedTracker:
    """A tracker whose first error is reported once and ends its logging, never the run.

    It gets the train records of the first step and every `every`-th after it
    (`step_scheduler.log_remote_every_steps`: AutoModel logs its 0-based steps 0, N, 2N...,
    which are tuneyard's steps 1, N+1, 2N+1...), and every validation record."""

    def __init__(self, tracker: Tracker, warn: Warn, every: int = 1):
        self.tracker, self.warn, self.alive = tracker, warn, True
        self.name, self.every = tracker.name, max(1, every)

    def _call(self, what: str, call: Callable[[], None]) -> None:
        if not self.alive:
            return
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - a tracker may fail any way; training goes on
            self.alive = False
            why = f"{what} failed ({type(exc).__name__}: {exc})"
            self.warn(self.name, f"{why}; it logs nothing more, metrics.jsonl has every step")

    def log_train(self, record: dict[str, Any]) -> None:
        if (int(record["step"]) - 1) % self.every:
            return
        self._call("logging a train record", lambda: self.tracker.log_train(record))

    def log_val(self, record: dict[str, Any]) -> None:
        self._call("logging a validation record", lambda: self.tracker.log_val(record))

    def finish(self, status: str) -> None:
        self._call("finishing the run", lambda: self.tracker.finish(status))


TRACKERS: tuple[tuple[str, type[WandbTracker] | type[MlflowTracker]], ...] = (
    ("wandb", WandbTracker),
    ("mlflow", MlflowTracker),
)


def open_trackers(recipe: Recipe, run_dir: Path, warn: Warn) -> list[GuardedTracker]:
    """The recipe's trackers, started (call on rank 0 only). One that cannot start is a
    warning; a missing package is a TrainerError."""
    trackers: list[GuardedTracker] = []
    every = recipe.step_scheduler.log_remote_every_steps
    for name, cls in TRACKERS:
        section = getattr(recipe, name)
        if section is None:
            continue
        try:
            trackers.append(GuardedTracker(cls(section, recipe, run_dir), warn, every))
        except TrainerError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tracker may fail any way; training goes on
            why = f"could not start ({type(exc).__name__}: {exc})"
            warn(name, f"{why}; training goes on without it, metrics.jsonl has every step")
    return trackers
