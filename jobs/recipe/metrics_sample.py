"""MetricsSample: the fields of one training or validation record, defined once.

The trainer writes one JSON line per optimizer step (`kind: train`) and per validation run
(`kind: val`) to `metrics.jsonl`; the worker ingests them into the `metrics` table, the API
serves them and the dashboard charts them. Every one of those reads the field list from
here: the ingest maps and types values by it, the API's `MetricRecord` schema is built
from it, and tests hold the table's columns and the trainer's records to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["train", "val"]
METRIC_KINDS: tuple[MetricKind, ...] = ("train", "val")


@dataclass(frozen=True)
class SampleField:
    name: str
    type: type  # int or float
    kinds: tuple[MetricKind, ...]  # which records carry it
    description: str


_BOTH: tuple[MetricKind, ...] = ("train", "val")
_TRAIN: tuple[MetricKind, ...] = ("train",)
SAMPLE_FIELDS: tuple[SampleField, ...] = (
    SampleField("step", int, _BOTH, "optimizer step the record belongs to (1-based)"),
    SampleField("epoch", int, _BOTH, "epoch of the data the step read (0-based)"),
    SampleField("loss", float, _TRAIN, "training loss per label token, averaged over ranks"),
    SampleField("val_loss", float, ("val",), "validation loss per label token"),
    SampleField("grad_norm", float, _TRAIN, "total gradient norm before clipping"),
    SampleField("lr", float, _TRAIN, "learning rate used by the step"),
    SampleField(
        "mem", float, _TRAIN, "rank 0 peak GiB: CUDA max allocated, else peak RSS growth in the run"
    ),
    SampleField("tps", float, _TRAIN, "tokens per second, all ranks together"),
    SampleField("tps_per_rank", float, _TRAIN, "tokens per second of one rank"),
    SampleField("mfu", float, _TRAIN, "model FLOPs utilisation (0..1), null when unknown"),
    SampleField("num_tokens", int, _BOTH, "tokens the step (or validation run) consumed"),
    SampleField("timestamp", float, _BOTH, "Unix time the record was written"),
)
SAMPLE_FIELD_NAMES = tuple(f.name for f in SAMPLE_FIELDS)
INT_FIELDS = tuple(f.name for f in SAMPLE_FIELDS if f.type is int)
FLOAT_FIELDS = tuple(f.name for f in SAMPLE_FIELDS if f.type is float)


def fields_of(kind: MetricKind) -> tuple[str, ...]:
    """The field names a record of `kind` carries (besides `kind` itself)."""
    return tuple(f.name for f in SAMPLE_FIELDS if kind in f.kinds)
