"""HTTP request and response models (pydantic), named by family: `JobCreate` in,
`JobPublic` / `JobsPublic` out, and the small records the job's sub-resources return.

Request models forbid unknown fields so a typo (`nproc_per_nod`) is a 422 naming it. A name a
person reads back (job name, label keys and values, Idempotency-Key) is `Printable`: no
control character, line separator or bidirectional control, which a terminal or a page
would act on instead of showing (`jobs.recipe.load.bounds.unsafe_char`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from api.recipe_schema import recipe_json_schema
from api.retention_schemas import CheckpointDeletionPublic, CheckpointRetention
from jobs.recipe.load.bounds import CONTROL_FIX, control_msg, unsafe_char
from jobs.recipe.load.limits import MAX_NNODES, MAX_NPROC_PER_NODE
from jobs.recipe.load.overrides import MAX_OVERRIDES, TOO_MANY
from jobs.recipe.metrics_sample import SAMPLE_FIELDS
from jobs.store.status import JobStatus

_LABEL_KEY = re.compile(r"\A[A-Za-z0-9_.\-/]{1,63}\Z")


def _printable(text: str) -> str:
    char = unsafe_char(text)
    if char is not None:
        raise ValueError(f"{control_msg(char)} | fix: {CONTROL_FIX}")
    return text


def _label_key(text: str) -> str:
    if not _LABEL_KEY.match(text):
        raise ValueError(
            "is not a label key | fix: use 1 to 63 letters, digits, '_', '.', '-' or '/'"
        )
    return text


def _at_most_max_overrides(value: Any) -> Any:
    """Counted before each text is read, with the validator's own error and fix."""
    if isinstance(value, list) and len(value) > MAX_OVERRIDES:
        raise ValueError(f"{TOO_MANY.msg} | fix: {TOO_MANY.fix}")
    return value


Printable = Annotated[str, AfterValidator(_printable)]
LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=63), AfterValidator(_label_key)
]
LabelValue = Annotated[Printable, StringConstraints(max_length=200)]
# `key=value`; bounded so 200 of them stay cheap to parse (a value is a number or a path).
OverrideText = Annotated[str, StringConstraints(max_length=4096)]
IdempotencyKey = Annotated[Printable, StringConstraints(min_length=1, max_length=255)]


class ResourcesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # within jobs.recipe.load.limits' world size (MAX_WORLD_SIZE ranks)
    nnodes: int = Field(1, ge=1, le=MAX_NNODES, description="Nodes (one worker per node).")
    nproc_per_node: int = Field(
        1, ge=1, le=MAX_NPROC_PER_NODE, description="Ranks per node (GPUs or CPU ranks)."
    )
    accelerator: Literal["cpu", "cuda"] = "cpu"


class JobCreate(BaseModel):
    """A job request: exactly one of `recipe` (an object) or `recipe_yaml` (text)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "llama-sft",
                    "recipe_yaml": "step_scheduler:\n  max_steps: 100\n",
                    "overrides": ["optimizer.lr=1e-4"],
                    "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"},
                    "labels": {"team": "nlp"},
                }
            ]
        },
    )

    name: Printable | None = Field(None, min_length=1, max_length=200)
    # Documented with the recipe's (advisory) schema; accepted as any object, as before.
    recipe: Annotated[
        dict[str, Any] | None,
        WithJsonSchema({"anyOf": [recipe_json_schema(), {"type": "null"}]}),
    ] = None
    recipe_yaml: str | None = Field(None, max_length=1_000_000)
    overrides: Annotated[list[OverrideText], BeforeValidator(_at_most_max_overrides)] = Field(
        default_factory=list, max_length=MAX_OVERRIDES
    )
    resources: ResourcesIn = Field(default_factory=ResourcesIn)
    priority: int = Field(0, ge=-1000, le=1000)
    max_attempts: int = Field(3, ge=1, le=20)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)


class JobRequestPublic(BaseModel):
    """What a job was submitted with, to submit a variant of it ("clone and edit")."""

    name: str | None = None
    recipe: dict[str, Any] | None = None
    recipe_yaml: str | None = Field(None, description="The YAML text as submitted, comments too.")
    overrides: list[str] = Field(default_factory=list)
    resources: dict[str, Any] = Field(default_factory=dict)
    priority: int = 0
    max_attempts: int = 3
    labels: dict[str, Any] = Field(default_factory=dict)


class RecipeTemplate(BaseModel):
    name: str = Field(description="The example's path under examples/, e.g. llm_finetune/x.yaml.")
    title: str = Field(description="The first line of the example's opening comment.")
    recipe_yaml: str


class RecipeTemplates(BaseModel):
    data: list[RecipeTemplate]


class FieldErrorOut(BaseModel):
    loc: str
    msg: str
    fix: str = ""


class ValidationErrors(BaseModel):
    """The 422 body."""

    errors: list[FieldErrorOut]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str
    message: str
    current_status: str | None = None
    job_id: str | None = None


class ErrorOut(BaseModel):
    """Every non-422 error body."""

    error: ErrorDetail


class ValidateOut(BaseModel):
    valid: bool
    errors: list[FieldErrorOut]
    warnings: list[FieldErrorOut] = Field(
        default_factory=list, description="Accepted but not used (e.g. AutoModel side sections)."
    )
    plan: dict[str, Any]
    recipe: dict[str, Any] | None = None
    queue: str


class JobPublic(BaseModel):
    id: str
    name: str
    project: str
    status: JobStatus
    terminal: bool = Field(
        description="The status never changes again (succeeded, failed, cancelled)."
    )
    queue: str
    priority: int
    labels: dict[str, Any]
    attempt: int = Field(description="Runs started: the first, each retry and each resume.")
    max_attempts: int
    failed_attempts: int = Field(
        0,
        description="Attempts that failed and were retried: the budget `max_attempts` limits "
        "(a pause and resume spends none).",
    )
    resources: dict[str, Any]
    overrides: list[str]
    recipe: dict[str, Any]
    plan: dict[str, Any]
    warnings: list[FieldErrorOut] = Field(
        default_factory=list, description="What validation accepted but the job does not use."
    )
    max_steps: int | None = None
    latest_metrics: dict[str, Any] | None = Field(None, description="The last train record.")
    actions: list[Literal["cancel", "pause", "resume"]] = Field(
        description="What a caller may ask for now."
    )
    error_code: str | None = None
    error_message: str | None = None
    run_dir: str | None = Field(
        None,
        description="The job's run directory, relative to the server's runs directory "
        "(TUNEYARD_RUNS_DIR): `<runs dir>/<run_dir>` on the server.",
    )
    idempotency_key: str | None = None
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


NEXT_CURSOR = "Pass as `cursor` for the next page (or the next poll); null at the end of a list."


class JobsPublic(BaseModel):
    """Every list answers this page shape: `data`, `has_more`, `next_cursor`."""

    data: list[JobPublic]
    has_more: bool = Field(False, description="More items follow this page.")
    next_cursor: str | None = Field(None, description=NEXT_CURSOR)
    count: int | None = Field(None, description="Jobs matching the filters, on every page.")


class EventPublic(BaseModel):
    id: int
    attempt: int
    kind: str
    from_status: str | None
    to_status: str | None
    message: str
    data: dict[str, Any]
    created_at: datetime
    label: str | None = Field(
        None,
        description="What happened, for a chart marker: pause, resume, cancel, preempt, retry, "
        "fail, finish, start, checkpoint or resume_check; null for other events.",
    )


class EventsPublic(BaseModel):
    data: list[EventPublic]
    has_more: bool = Field(False, description="More events follow this page.")
    next_cursor: str | None = Field(None, description=NEXT_CURSOR)
    next_after: int | None = Field(None, description="Deprecated: `next_cursor` as a number.")


# One MetricsSample record as stored: its fields come from `jobs.recipe.metrics_sample`.
MetricRecord = create_model(
    "MetricRecord",
    id=(int, ...),
    kind=(str, ...),
    attempt=(int, ...),
    step=(int, Field(..., description="optimizer step the record belongs to (1-based)")),
    **{
        f.name: (f.type | None, Field(None, description=f.description))
        for f in SAMPLE_FIELDS
        if f.name != "step"
    },
)


class MetricsPublic(BaseModel):
    data: list[MetricRecord]
    kind: str
    downsampled: bool
    has_more: bool = Field(False, description="More raw records follow this page.")
    next_cursor: str | None = Field(None, description=NEXT_CURSOR)
    next_after_step: int | None = Field(
        None, description="Deprecated: `next_cursor` as a number (the last step returned)."
    )


class LogLine(BaseModel):
    id: int
    attempt: int
    stream: str
    text: str
    created_at: datetime


class LogsPublic(BaseModel):
    data: list[LogLine]
    has_more: bool = Field(False, description="More lines follow this page.")
    next_cursor: str | None = Field(None, description=NEXT_CURSOR)
    lines: list[LogLine] = Field(description="Deprecated: the same lines as `data`.")
    next_after: int | None = Field(None, description="Deprecated: `next_cursor` as a number.")


class CheckpointPublic(BaseModel):
    id: int
    attempt: int
    step: int
    path: str
    size_bytes: int | None
    metrics: dict[str, Any]
    created_at: datetime
    kept_because: list[str] = Field(
        default_factory=list,
        description="Why retention keeps it: latest, best <metric> #<rank>, last <N>, "
        "resumable, or that nothing limits retention; empty: the next save may delete it.",
    )
    evicted_at: datetime | None = Field(
        None, description="When its local copy was evicted; the artifact store holds it."
    )
    stored_only: bool = Field(
        False, description="Only the artifact store holds it (the local copy was evicted)."
    )


class CheckpointsPublic(BaseModel):
    data: list[CheckpointPublic] = Field(description="The checkpoints that exist, by step.")
    deleted: list[CheckpointDeletionPublic] = Field(
        default_factory=list, description="Checkpoints deleted by retention, when and why."
    )


class ModelPublic(BaseModel):
    architecture: str
    family: str
    tie_support: str
    capabilities: dict[str, bool]
    notes: str = ""


class ModelsPublic(BaseModel):
    data: list[ModelPublic]


class ProjectPublic(BaseModel):
    name: str
    allow_remote_code: bool = Field(
        description="Recipes of this project may set model.trust_remote_code: true."
    )
    created_at: datetime
    checkpoint_retention: CheckpointRetention | None = Field(
        None, description="The policy for finished jobs' checkpoints; null: none."
    )


class ProjectUpdate(BaseModel):
    """The settings to change; a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid")

    allow_remote_code: bool | None = None
    checkpoint_retention: CheckpointRetention | None = None

    @field_validator("allow_remote_code")
    @classmethod
    def _not_null(cls, value: bool | None) -> bool:
        if value is None:
            raise ValueError("must be true or false | fix: leave allow_remote_code out to keep it")
        return value

    @model_validator(mode="after")
    def _changes_something(self) -> ProjectUpdate:
        if not self.model_fields_set:
            raise ValueError(
                "changes nothing | fix: give allow_remote_code, checkpoint_retention or both"
            )
        return self


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["admin", "submit", "read"]


class KeyCreated(BaseModel):
    id: int
    project: str
    role: str
    prefix: str
    key: str = Field(description="Shown once; only its hash is stored.")


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
