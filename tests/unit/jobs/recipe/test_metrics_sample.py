"""Every reader of MetricsSample agrees with its one definition: the table, the trainer's
records, the API schema, the ingest and the dashboard's charts."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from jobs.recipe.metrics_sample import FLOAT_FIELDS, INT_FIELDS, SAMPLE_FIELD_NAMES, fields_of
from jobs.store.ingest import METRIC_COLUMNS
from jobs.store.tables import Metric

ROOT = Path(__file__).resolve().parents[4]


def test_the_table_has_a_column_per_field_and_nothing_else():
    columns = {c.name for c in Metric.__table__.columns}
    assert columns - set(SAMPLE_FIELD_NAMES) == {"id", "job_id", "attempt", "kind"}
    assert set(SAMPLE_FIELD_NAMES) <= columns
    assert set(METRIC_COLUMNS) == set(SAMPLE_FIELD_NAMES) | {"job_id", "attempt", "kind"}


def test_each_field_is_an_int_or_a_float():
    assert set(INT_FIELDS) | set(FLOAT_FIELDS) == set(SAMPLE_FIELD_NAMES)
    assert not set(INT_FIELDS) & set(FLOAT_FIELDS)


def test_the_trainer_writes_exactly_the_fields_of_each_kind():
    from trainer.metrics import TrainRecord, ValRecord

    for record, kind in ((TrainRecord, "train"), (ValRecord, "val")):
        names = {f.name for f in dataclasses.fields(record)} - {"kind"}
        assert names == set(fields_of(kind)), kind


def test_the_api_serves_every_field():
    from api.schemas import MetricRecord

    assert set(MetricRecord.model_fields) == set(SAMPLE_FIELD_NAMES) | {"id", "kind", "attempt"}


def test_the_dashboard_charts_only_real_fields():
    script = (ROOT / "api" / "static" / "js" / "job.js").read_text()
    block = script[script.index("const CHARTS") : script.index("];", script.index("const CHARTS"))]
    charted = re.findall(r'\["(\w+)",', block)
    assert charted and set(charted) <= set(SAMPLE_FIELD_NAMES)
