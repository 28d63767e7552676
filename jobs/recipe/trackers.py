"""The `wandb:` and `mlflow:` sections: which experiment trackers rank 0 logs to.

A recipe that carries either section makes the trainer log every MetricsSample and
validation record to that tracker as well as to `metrics.jsonl` (`trainer.trackers`). The
keys are AutoModel's (`wandb: {project, entity, name, save_dir, ...}`, `mlflow:
{experiment_name, run_name, tracking_uri, ...}`). Each tracker is an optional package
(`pip install 'tuneyard[wandb]'`): `TRACKER_PACKAGES` names its import name, and the job
then requires it (`jobs.recipe.requirements`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from jobs.recipe.errors import FieldError
from jobs.recipe.schema_errors import field_errors

TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class WandbSection(_Section):
    project: str | None = None
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    job_type: str | None = None
    notes: str | None = None
    tags: list[str] = []
    save_dir: str | None = None
    dir: str | None = None
    mode: Literal["online", "offline", "disabled"] | None = None


class MlflowSection(_Section):
    experiment_name: str | None = None
    run_name: str | None = None
    tracking_uri: str | None = None
    artifact_location: str | None = None
    tags: dict[str, str] = {}


@dataclass(frozen=True)
class Wandb:
    project: str | None
    entity: str | None
    name: str | None
    group: str | None
    job_type: str | None
    notes: str | None
    tags: list[str]
    save_dir: str | None
    dir: str | None
    mode: str | None


@dataclass(frozen=True)
class Mlflow:
    experiment_name: str | None
    run_name: str | None
    tracking_uri: str | None
    artifact_location: str | None
    tags: dict[str, str] = field(default_factory=dict)


SECTIONS: dict[str, type[_Section]] = {"wandb": WandbSection, "mlflow": MlflowSection}


def check_trackers(data: dict[str, Any], out: dict[str, Any]) -> list[FieldError]:
    """`out["wandb"]` / `out["mlflow"]`: the section with defaults filled, or None when absent."""
    errors: list[FieldError] = []
    for name, cls in SECTIONS.items():
        value = data.get(name)
        out[name] = None
        if value is None:
            continue
        if not isinstance(value, dict):
            errors.append(FieldError(name, "must be a mapping", f"write {name}: as a mapping"))
            continue
        try:
            out[name] = cls.model_validate(value).model_dump(mode="json")
        except ValidationError as exc:
            errors += field_errors(exc, name, cls.model_fields)
    return errors


def tracker_packages(normalized: dict[str, Any]) -> set[str]:
    """Import names of the tracker packages a normalized recipe needs."""
    return {pkg for name, pkg in TRACKER_PACKAGES.items() if normalized.get(name) is not None}
