"""The database tables: SQLAlchemy 2 declarative models shared by the API and the worker.

One `Base` holds every table tuneyard keeps: projects and their API keys, jobs (the request,
the normalized recipe and plan, lease and attempt for the worker), the job's event history,
metric samples (unique per job/kind/step so ingestion can upsert), log lines, checkpoints and
workers. Types work on PostgreSQL (JSONB, BIGINT identities, timestamptz) and SQLite (JSON
text, INTEGER rowids); every timestamp is timezone-aware UTC in Python on both. Only
`jobs.orchestration.states.transition` writes `Job.status`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    DDL,
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    event,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobs.store.status import ExportStatus, JobStatus, WorkerStatus

JOB_STATUSES = tuple(s.value for s in JobStatus)
API_KEY_ROLES = ("admin", "submit", "read")
WEBHOOK_DELIVERY_STATUSES = ("pending", "succeeded", "failed")

# Stable constraint names: Alembic can drop them on both backends (SQLite batch mode too).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid); PostgreSQL gets BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    return str(uuid.uuid4())


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamptz that always comes back aware in UTC (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(UTC)")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType}


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A project admin's grant: recipes may set `model.trust_remote_code: true`.
    allow_remote_code: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (CheckConstraint(_in("role", API_KEY_ROLES), name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        UniqueConstraint("project_id", "idempotency_key", name="uq_jobs_project_idempotency"),
        Index("ix_jobs_project_created", "project_id", "created_at", "id"),
        Index("ix_jobs_project_status_created", "project_id", "status", "created_at"),
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
        Index("ix_jobs_status_dispatched", "status", "dispatched_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    recipe: Mapped[dict[str, Any]] = mapped_column(default=dict)
    plan: Mapped[dict[str, Any]] = mapped_column(default=dict)
    resources: Mapped[dict[str, Any]] = mapped_column(default=dict)
    queue: Mapped[str] = mapped_column(String(32), default="cpu")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    lease_owner: Mapped[str | None] = mapped_column(String(255), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error_message: Mapped[str | None] = mapped_column(Text, default=None)
    run_dir: Mapped[str | None] = mapped_column(Text, default=None)
    dispatched_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(32))
    from_status: Mapped[str | None] = mapped_column(String(16), default=None)
    to_status: Mapped[str | None] = mapped_column(String(16), default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Metric(Base):
    """One MetricsSample line; the worker upserts on (job_id, kind, step)."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "kind", "step", name="uq_metrics_job_kind_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    loss: Mapped[float | None] = mapped_column(Float, default=None)
    val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    grad_norm: Mapped[float | None] = mapped_column(Float, default=None)
    lr: Mapped[float | None] = mapped_column(Float, default=None)
    mem: Mapped[float | None] = mapped_column(Float, default=None)
    tps: Mapped[float | None] = mapped_column(Float, default=None)
    tps_per_rank: Mapped[float | None] = mapped_column(Float, default=None)
    mfu: Mapped[float | None] = mapped_column(Float, default=None)
    num_tokens: Mapped[int | None] = mapped_column(BigInteger, default=None)
    timestamp: Mapped[float | None] = mapped_column(Float, default=None)


class MetricRollup(Base):
    """Per block of `ROLLUP_BLOCK` steps of one job and kind: where its lowest and highest
    loss (val_loss for `val`) are, and its last step. PostgreSQL keeps it current with
    statement triggers on `metrics` (`ROLLUP_DDL`), whoever writes the metrics; downsampled
    reads then touch one row per block instead of every record. SQLite has the table but no
    trigger: its reads scan the records."""

    __tablename__ = "metric_rollups"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    block: Mapped[int] = mapped_column(Integer, primary_key=True)
    min_value: Mapped[float | None] = mapped_column(Float, default=None)
    min_step: Mapped[int | None] = mapped_column(Integer, default=None)
    max_value: Mapped[float | None] = mapped_column(Float, default=None)
    max_step: Mapped[int | None] = mapped_column(Integer, default=None)
    last_step: Mapped[int] = mapped_column(Integer)


ROLLUP_BLOCK = 50  # steps per rollup row
# Recompute the rollup rows of the blocks a statement touched: per job and kind, every block
# from its lowest to its highest touched step (one index range scan; ingestion batches and
# replays are contiguous). Recomputing a block is always right, so a sparse statement only
# costs extra work. Ties go to the lowest step (hence -step in the max). NULL values are
# left out of the extremes (PostgreSQL sorts a NULL array element above every number).
_ROLLUP_FUNCTION = f"""
CREATE OR REPLACE FUNCTION tuneyard_metric_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO metric_rollups (job_id, kind, block, min_value, min_step, max_value, max_step,
                              last_step)
  SELECT m.job_id, m.kind, m.step / {ROLLUP_BLOCK},
         min(x.v), ((min(ARRAY[x.v, m.step::float8]) FILTER (WHERE x.v IS NOT NULL)))[2]::int,
         max(x.v), -((max(ARRAY[x.v, -m.step::float8]) FILTER (WHERE x.v IS NOT NULL)))[2]::int,
         max(m.step)
  FROM (SELECT job_id, kind, min(step) AS lo, max(step) AS hi FROM touched
        GROUP BY job_id, kind) t
  JOIN metrics m ON m.job_id = t.job_id AND m.kind = t.kind
   AND m.step >= t.lo / {ROLLUP_BLOCK} * {ROLLUP_BLOCK}
   AND m.step < (t.hi / {ROLLUP_BLOCK} + 1) * {ROLLUP_BLOCK}
  CROSS JOIN LATERAL (SELECT CASE WHEN m.kind = 'val' THEN m.val_loss ELSE m.loss END AS v) x
  GROUP BY m.job_id, m.kind, m.step / {ROLLUP_BLOCK}
  ON CONFLICT (job_id, kind, block) DO UPDATE SET
    min_value = EXCLUDED.min_value, min_step = EXCLUDED.min_step,
    max_value = EXCLUDED.max_value, max_step = EXCLUDED.max_step,
    last_step = EXCLUDED.last_step;
  RETURN NULL;
END $$;
"""
ROLLUP_DDL = (
    _ROLLUP_FUNCTION,
    "CREATE TRIGGER tuneyard_metric_rollup_insert AFTER INSERT ON metrics "
    "REFERENCING NEW TABLE AS touched FOR EACH STATEMENT "
    "EXECUTE FUNCTION tuneyard_metric_rollup()",
    "CREATE TRIGGER tuneyard_metric_rollup_update AFTER UPDATE ON metrics "
    "REFERENCING NEW TABLE AS touched FOR EACH STATEMENT "
    "EXECUTE FUNCTION tuneyard_metric_rollup()",
)
ROLLUP_DROP = (
    "DROP TRIGGER IF EXISTS tuneyard_metric_rollup_insert ON metrics",
    "DROP TRIGGER IF EXISTS tuneyard_metric_rollup_update ON metrics",
    "DROP FUNCTION IF EXISTS tuneyard_metric_rollup()",
)
for _statement in ROLLUP_DDL:  # create_all (tests, the embedded default) gets them too
    event.listen(Metric.__table__, "after_create", DDL(_statement).execute_if(dialect="postgresql"))


class JobLog(Base):
    """A line (or chunk) of a job's stdout/stderr; `seq` set makes re-ingestion a no-op."""

    __tablename__ = "job_logs"
    __table_args__ = (
        Index("ix_job_logs_job_id_id", "job_id", "id"),
        UniqueConstraint("job_id", "attempt", "stream", "seq", name="uq_job_logs_line"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    stream: Mapped[str] = mapped_column(String(16), default="stdout")
    seq: Mapped[int | None] = mapped_column(BigInteger, default=None)
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set when the local copy was evicted (only the artifact store holds it); not a deletion.
    evicted_at: Mapped[datetime | None] = mapped_column(default=None)


class Worker(Base):
    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(String(32))
    resources: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default=WorkerStatus.ONLINE.value)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(default=utcnow)


class StepSample(Base):
    """Which dataset rows made one training step (the trainer's `samples.jsonl`); the worker
    upserts on (job_id, step), a later attempt's rows replacing an earlier one's."""

    __tablename__ = "step_samples"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_step_samples_job_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    rows: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {"rows": [{index, ...}]}


class DatasetRow(Base):
    """A training row's preview (decoded tokens, capped), once per job and dataset index."""

    __tablename__ = "dataset_rows"
    __table_args__ = (UniqueConstraint("job_id", "row_index", name="uq_dataset_rows_job_row"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    row_index: Mapped[int] = mapped_column(BigInteger)
    row_id: Mapped[str | None] = mapped_column(Text, default=None)
    tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    preview: Mapped[str | None] = mapped_column(Text, default=None)


class Webhook(Base):
    """A project's subscription: the URL to POST to, the events it wants, and the secret that
    signs each delivery (kept as given, since signing needs it; the API never answers it)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_project_id", "project_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSONType, default=list)
    secret: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one webhook in the outbox, written in the transaction of the event that
    caused it; `delivery_id` is the same on every attempt. A `pending` row is due at
    `next_attempt_at` (the sender pushes it forward while it sends: a lease)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint(_in("status", WEBHOOK_DELIVERY_STATUSES), name="status"),
        UniqueConstraint("webhook_id", "dedupe_key", name="uq_webhook_deliveries_dedupe"),
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_webhook_id", "webhook_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(String(36), unique=True, default=new_job_id)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(64))
    # Set for events that may be reported twice (a replayed checkpoint): one delivery each.
    dedupe_key: Mapped[str | None] = mapped_column(String(200), default=None)
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the body, as sent
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column(default=None)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_response: Mapped[str | None] = mapped_column(Text, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)


EXPORT_STATUSES = tuple(s.value for s in ExportStatus)
EXPORT_KINDS = ("merged", "adapter", "full")
EXPORT_DTYPES = ("float32", "bfloat16", "float16")


class Export(Base):
    """One export of a job's checkpoint, run as work of its own by a worker: `merged` (LoRA
    folded into the base), `adapter` (the PEFT adapter alone) or `full` (a full fine-tune's
    weights). Leased like a job (attempt as fencing token); `path` is the published
    directory under the job's run directory once `succeeded`. Only
    `jobs.orchestration.export_states` writes `status`."""

    __tablename__ = "exports"
    __table_args__ = (
        CheckConstraint(_in("status", EXPORT_STATUSES), name="status"),
        CheckConstraint(_in("kind", EXPORT_KINDS), name="kind"),
        CheckConstraint(_in("dtype", EXPORT_DTYPES), name="dtype"),
        Index("ix_exports_job_created", "job_id", "created_at"),
        Index("ix_exports_status_lease", "status", "lease_expires_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    merge_lora: Mapped[bool] = mapped_column(Boolean, default=True)
    dtype: Mapped[str] = mapped_column(String(16), default="float32")
    status: Mapped[str] = mapped_column(String(16), default=ExportStatus.QUEUED.value)
    queue: Mapped[str] = mapped_column(String(32), default="cpu")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(255), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    path: Mapped[str | None] = mapped_column(Text, default=None)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error_message: Mapped[str | None] = mapped_column(Text, default=None)
    dispatched_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class ExportEvent(Base):
    """An export's history: every status change, and what its subprocess reported."""

    __tablename__ = "export_events"
    __table_args__ = (Index("ix_export_events_export_id_id", "export_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    export_id: Mapped[str] = mapped_column(ForeignKey("exports.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(32))
    from_status: Mapped[str | None] = mapped_column(String(16), default=None)
    to_status: Mapped[str | None] = mapped_column(String(16), default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CheckpointRetentionPolicy(Base):
    """A project's retention for its finished jobs' checkpoints (`PATCH /v1/projects/{name}`):
    at most `max_bytes` in all, none older than `max_age_days` after its job finished;
    `worker.retention` applies it."""

    __tablename__ = "checkpoint_retention_policies"

    project_id: Mapped[int] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True
    )
    max_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    max_age_days: Mapped[int | None] = mapped_column(Integer, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class CheckpointDeletion(Base):
    """A checkpoint that was deleted: by the trainer's retention (`keep_last`, `keep_best`)
    or by the project's policy; one row per job and step, written once."""

    __tablename__ = "checkpoint_deletions"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoint_deletions_job_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    source: Mapped[str] = mapped_column(String(16))  # "trainer" or "policy"
    reason: Mapped[str] = mapped_column(Text)
    deleted_at: Mapped[datetime] = mapped_column(default=utcnow)


class Artifact(Base):
    """A checkpoint or export held complete in the artifact store (its manifest written):
    `key` is its `s3://` URL, `sha256` the manifest's digest, `files` the manifest's list of
    {path, size, sha256}. Written by the worker after the upload; one row per job, kind and
    name, a re-upload replacing it."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("job_id", "kind", "name", name="uq_artifacts_job_kind_name"),
        CheckConstraint(_in("kind", ("checkpoint", "export")), name="kind"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    step: Mapped[int | None] = mapped_column(Integer, default=None)
    key: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str] = mapped_column(String(64))
    files: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {"files": [...]}
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)  # gone from the store
