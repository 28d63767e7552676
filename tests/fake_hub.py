"""A dataset repo in the Hugging Face hub-cache layout, built on disk for tests.

`write_hub_dataset` lays a repo out as `snapshot_download` leaves it: content-addressed files
under `blobs/`, a `snapshots/<commit>/` tree of symlinks to them, `refs/main` holding the
commit, and a README whose `configs` block maps splits to parquet shards, as the real
`rajpurkar/squad` repo does. `squad_hub_rows` flattens SQuAD JSON into that repo's row shape.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def squad_hub_rows(squad_json: Path) -> list[dict[str, Any]]:
    """Rows {id, title, context, question, answers: {text, answer_start}} of a SQuAD v1 file."""
    doc = json.loads(squad_json.read_text())
    return [
        {
            "id": qa["id"],
            "title": article.get("title", ""),
            "context": para["context"],
            "question": qa["question"],
            "answers": {
                "text": [a["text"] for a in qa["answers"]],
                "answer_start": [a["answer_start"] for a in qa["answers"]],
            },
        }
        for article in doc["data"]
        for para in article["paragraphs"]
        for qa in para["qas"]
    ]


def _parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def _readme(config: str, splits: list[str]) -> bytes:
    files = "".join(f"  - split: {s}\n    path: {config}/{s}-*\n" for s in splits)
    return f"---\nconfigs:\n- config_name: {config}\n  data_files:\n{files}  default: true\n---\n".encode()


def _put(repo: Path, snapshot: Path, relative: str, content: bytes) -> None:
    blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    link = snapshot / relative
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("../" * (relative.count("/") + 2)) / "blobs" / blob.name)


def write_hub_dataset(
    hub_cache: Path,
    repo_id: str,
    splits: dict[str, list[dict[str, Any]]],
    config: str = "plain_text",
) -> Path:
    """Cache `repo_id` with one parquet shard per split under `<config>/`; returns the snapshot."""
    repo = hub_cache / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    _put(repo, snapshot, "README.md", _readme(config, list(splits)))
    for split, rows in splits.items():
        _put(repo, snapshot, f"{config}/{split}-00000-of-00001.parquet", _parquet_bytes(rows))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot
