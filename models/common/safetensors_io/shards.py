"""Checkpoint directories: shard planning, transformers' shard names, the index file.

A checkpoint is `model.safetensors` alone, or shards named `model-0000i-of-0000n.safetensors`
plus `model.safetensors.index.json`, as transformers writes them. This module owns how
tensors are split into shards, what the files are called, writing the index, and finding a
directory's files again (the index's shards, the single file, or every `*.safetensors`),
refusing an index whose weight map points outside its directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from models.common.safetensors_io.format import CheckpointError, TensorEntry

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def plan_shards(entries: list[TensorEntry], max_shard_bytes: int) -> list[list[TensorEntry]]:
    """Entries, in order, split into files of at most `max_shard_bytes` each; a tensor larger
    than the limit gets a file of its own. Always at least one (possibly empty) shard."""
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for entry in entries:
        if shards[-1] and size + entry.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


def shard_file_names(count: int) -> list[str]:
    """`model.safetensors` alone, else `model-0000i-of-0000n.safetensors` (transformers' names)."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_index(directory: Path, shards: list[list[TensorEntry]]) -> Path | None:
    """`model.safetensors.index.json` for more than one shard (a single file needs none)."""
    if len(shards) <= 1:
        return None
    names = shard_file_names(len(shards))
    weight_map = {e.name: file for file, shard in zip(names, shards, strict=True) for e in shard}
    total = sum(e.nbytes for shard in shards for e in shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    path = directory / INDEX_FILE
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return path


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files of a directory: the index's shards, the single file, or all."""
    index = directory / INDEX_FILE
    if index.is_file():
        names = dict.fromkeys(_weight_map(index).values())
        files = [directory / name for name in names]
    elif (directory / SINGLE_FILE).is_file():
        files = [directory / SINGLE_FILE]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} holds no *.safetensors weights")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{directory}: shards named in {INDEX_FILE} are missing: {missing}")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index ({exc!r})") from None
    for file in weight_map.values() if isinstance(weight_map, dict) else [None]:
        # A shard name is a plain file name: an index never points outside its directory.
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
            raise CheckpointError(f"{index}: weight_map names {file!r}, not a shard file name")
    return weight_map
