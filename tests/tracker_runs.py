"""Reading back what the experiment trackers wrote, offline: W&B run files and MLflow stores.

An offline W&B run keeps every record it was sent in `run-<id>.wandb`: a log of 32 KiB
blocks (W&B's LevelDB-style format: a 7-byte file header, then records of a 7-byte header
— CRC, little-endian length, type — and a protobuf `Record`, split across blocks when
long). Reading that file needs no network and no `wandb sync`. The service writes it
after `finish()` returns, so `wandb_runs` waits for each run's exit record; a record the
service has not finished writing is left for the next read (`wandb_payloads`).
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FILE_HEADER = 7  # b":W&B", magic 0xBEE1, version
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class WandbRun:
    run_id: str
    project: str
    name: str
    tags: list[str]
    config: dict[str, Any]
    history: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> logged values
    exit_code: int | None = None


def wandb_payloads(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a W&B run file"
    out, pos, pending = [], FILE_HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        if pos + RECORD_HEADER + length > len(data):  # the record being written now
            break
        chunk = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        if kind in (FULL, LAST):
            out.append(pending)
    return out


def wandb_runs(directory: Path, timeout: float = 30.0) -> list[WandbRun]:
    """Every offline run under `directory` (the `dir` given to wandb.init), once each has
    its exit record: W&B's service writes the file after `finish()` has returned."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [read_wandb_file(p) for p in sorted(directory.glob("wandb/offline-run-*/run-*.wandb"))]  # fmt: skip
        if all(r.exit_code is not None for r in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.1)


def read_wandb_file(path: Path) -> WandbRun:
    from wandb.proto import wandb_internal_pb2 as pb

    run = WandbRun("", "", "", [], {})
    for payload in wandb_payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.project = record.run.run_id, record.run.project
            run.name, run.tags = record.run.display_name, list(record.run.tags)
            run.config.update(_config(record.run.config))
        elif kind == "config":
            run.config.update(_config(record.config))
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}  # fmt: skip
            step = int(items.pop("_step", record.history.step.num))
            values = {k: v for k, v in items.items() if not k.startswith("_")}
            run.history.setdefault(step, {}).update(values)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def _config(config: Any) -> dict[str, Any]:
    found = {u.key: json.loads(u.value_json) for u in config.update}
    return {k: (v.get("value") if isinstance(v, dict) and "value" in v else v) for k, v in found.items()}  # fmt: skip


def mlflow_history(tracking_uri: str, experiment: str) -> dict[str, dict[int, float]]:
    """The one run of `experiment`: metric name -> {step: value}, read back by MlflowClient."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {tracking_uri}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs in {experiment!r}, expected one"
    run = runs[0]
    return {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        for key in run.data.metrics
    }


def isolate_trackers(home: Path, monkeypatch: Any) -> Path:
    """W&B offline with every directory under `home`, and no tracker credentials or run ids
    from the caller's environment: nothing reaches the network or $HOME (subprocesses too)."""
    for var, sub in (("WANDB_DIR", "dir"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"),
                     ("WANDB_ARTIFACT_DIR", "artifacts")):  # fmt: skip
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(var, raising=False)
    return home
