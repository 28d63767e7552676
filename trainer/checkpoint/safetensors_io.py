"""Streaming safetensors: write a file one tensor at a time, read tensors into a model.

The safetensors layout is an 8-byte little-endian header length, a JSON header (dtype,
shape and byte offsets of every tensor) and the raw bytes. Offsets depend only on shapes
and dtypes, which every rank knows from DTensor metadata, so the header is written first
and each tensor is gathered, written and dropped in turn: peak extra memory is the largest
tensor, not the model. The files are what `safetensors.torch.save_file` writes.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors import safe_open

_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(entries: list[TensorEntry], max_shard_bytes: int) -> list[list[TensorEntry]]:
    """Split entries, in order, into files of at most `max_shard_bytes` (one tensor may exceed)."""
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for entry in entries:
        if shards[-1] and size + entry.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


def header_bytes(entries: list[TensorEntry], metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for entry in entries:
        header[entry.name] = {
            "dtype": _DTYPE_NAMES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_tensor(handle: BinaryIO, tensor: torch.Tensor) -> None:
    data = tensor.detach().to("cpu").contiguous()
    if data.dim() == 0:
        data = data.reshape(1)
    handle.write(memoryview(data.view(torch.uint8).numpy()))


class SafetensorsFileWriter:
    """Open a file, write the header, then accept the tensors in header order."""

    def __init__(self, path: Path, entries: list[TensorEntry], metadata: dict[str, str]):
        self.path, self.entries = path, entries
        self._handle: BinaryIO | None = path.open("wb")
        self._handle.write(header_bytes(entries, metadata))
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        entry = self.entries[self._next]
        if entry.name != name or tuple(tensor.shape) != entry.shape:
            raise RuntimeError(
                f"safetensors writer expected {entry.name} {entry.shape}, "
                f"got {name} {tuple(tensor.shape)}"
            )
        assert self._handle is not None
        write_tensor(self._handle, tensor.to(entry.dtype))
        self._next += 1

    def close(self) -> None:
        if self._handle is None:
            return
        if self._next != len(self.entries):
            raise RuntimeError(f"{self.path}: {len(self.entries) - self._next} tensors missing")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        self._handle = None


def iter_safetensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of `model.safetensors` or the shards an index names, one at a time."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(directory.glob("*.safetensors"))]
    for name in files:
        with safe_open(str(directory / name), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                yield key, handle.get_tensor(key)
