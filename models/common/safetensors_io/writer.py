"""Streaming safetensors writer: header first, then one tensor at a time into its slot.

The header is computed from shapes and dtypes alone, so each tensor can be produced,
written and dropped in turn: peak extra memory is one tensor, not the model. Files are
fsynced on close; `save_safetensors` writes a single file or shards plus their index.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import torch

from models.common.safetensors_io.format import TensorEntry, _layout, header_bytes
from models.common.safetensors_io.shards import plan_shards, shard_file_names, write_index


class SafetensorsFileWriter:
    """Write the header at once, then each declared tensor (any order) into its slot.

    Only the tensor being written is held; `close` refuses a file with tensors missing and
    fsyncs it. Leaving a `with` block on an exception closes the handle without that check.
    """

    def __init__(
        self, path: Path, entries: list[TensorEntry], metadata: dict[str, str] | None = None
    ) -> None:
        self.path = path
        self._entries = {e.name: e for e in entries}
        header = header_bytes(entries, metadata)
        self._base = len(header)
        self._offsets = _layout(entries)
        self._written: set[str] = set()
        self._handle: BinaryIO | None = path.open("wb")
        self._handle.write(header)
        self._handle.truncate(self._base + sum(e.nbytes for e in entries))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        entry = self._entries.get(name)
        if entry is None or name in self._written:
            why = "written twice" if entry else "not declared in the header"
            raise ValueError(f"{self.path}: tensor {name} is {why}")
        if tensor.dtype != entry.dtype or tuple(tensor.shape) != entry.shape:
            raise ValueError(
                f"{self.path}: header declares {name} as {entry.dtype} {entry.shape}, "
                f"got {tensor.dtype} {tuple(tensor.shape)}"
            )
        assert self._handle is not None, "writer is closed"
        data = tensor.detach().to("cpu").contiguous()
        if data.numel():
            self._handle.seek(self._base + self._offsets[name][0])
            self._handle.write(data.reshape(-1).view(torch.uint8).numpy().data)
        self._written.add(name)

    def close(self) -> None:
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        with handle:
            missing = sorted(set(self._entries) - self._written)
            if missing:
                raise ValueError(f"{self.path}: tensors never written: {missing[:3]}")
            handle.flush()
            os.fsync(handle.fileno())

    def __enter__(self) -> SafetensorsFileWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        elif self._handle is not None:  # the caller's error wins; the file is incomplete
            self._handle.close()


def write_file(
    path: Path,
    entries: list[TensorEntry],
    tensors: Iterable[tuple[str, torch.Tensor]],
    metadata: dict[str, str] | None = None,
) -> None:
    """One file from declared `entries` and their values; `tensors` may be a generator that
    produces each tensor only when asked, so one exists at a time."""
    with SafetensorsFileWriter(path, entries, metadata) as writer:
        for name, tensor in tensors:
            writer.write(name, tensor)


def save_safetensors(
    directory: Path, items: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int = 5 * 2**30
) -> list[Path]:
    """Write tensors that already exist (or views of them) as a single file or shards plus
    an index; nothing is concatenated or copied beyond one tensor's CPU contiguous form."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = dict(items)
    shards = plan_shards([TensorEntry.of(n, t) for n, t in tensors.items()], max_shard_bytes)
    paths = []
    for name, shard in zip(shard_file_names(len(shards)), shards, strict=True):
        write_file(directory / name, shard, ((e.name, tensors[e.name]) for e in shard))
        paths.append(directory / name)
    write_index(directory, shards)
    return paths
