"""The safetensors format: dtype table, tensor sizes and layout, header writing and checking.

A safetensors file is an 8-byte little-endian header length, a JSON header (dtype, shape
and data offsets of every tensor) and the data section. This module owns that layout: the
dtype codes, the header computed from shapes and dtypes alone (laid out as
`safetensors.torch.save_file` lays it out), and the header read back and validated against
the file before any tensor is touched (length sane and inside the file, offsets inside the
data section, covering it without overlap or gap, each range exactly shape x dtype bytes).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_METADATA = {"format": "pt"}  # transformers refuses files whose format is not "pt"
# The safetensors library refuses headers past 100 MB; so do we, before allocating one.
MAX_HEADER_BYTES = 100_000_000
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
    "F4": torch.float4_e2m1fn_x2,
}
CODES = {dtype: code for code, dtype in DTYPES.items()}
# F4 headers count 4-bit values; torch packs two per float4_e2m1fn_x2 element (last dim).
_VALUES_PER_ELEMENT = {"F4": 2}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: missing, malformed, or not what the model expects."""


# --- shapes, sizes and layout -----------------------------------------------------------
@dataclass(frozen=True)
class TensorEntry:
    """A tensor to write, known before its values exist: name, dtype, torch shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorEntry:
        return cls(name, tensor.dtype, tuple(tensor.shape))


def _header_shape(code: str, shape: tuple[int, ...]) -> list[int]:
    packed = _VALUES_PER_ELEMENT.get(code, 1)
    if packed == 1:
        return list(shape)
    if not shape:
        raise ValueError(f"safetensors: a 0-dim {code} tensor has no whole-byte header shape")
    return [*shape[:-1], shape[-1] * packed]


def _torch_shape(code: str, shape: list[int]) -> tuple[int, ...] | None:
    """The torch shape of a header shape, or None when the packing does not divide it."""
    packed = _VALUES_PER_ELEMENT.get(code, 1)
    if packed > 1 and (not shape or shape[-1] % packed):
        return None
    return (*shape[:-1], shape[-1] // packed) if packed > 1 else tuple(shape)


def _layout(entries: list[TensorEntry]) -> dict[str, tuple[int, int]]:
    """Data offsets per tensor, widest element first (stable), as `save_file` orders them:
    every tensor then starts at a multiple of its element size, so readers that map the
    file can view it without copying."""
    if len({e.name for e in entries}) != len(entries):
        raise ValueError("safetensors: tensor names must be unique")
    order = sorted(entries, key=lambda e: -torch.empty((), dtype=e.dtype).element_size())
    offsets, offset = {}, 0
    for entry in order:
        offsets[entry.name] = (offset, offset + entry.nbytes)
        offset += entry.nbytes
    return offsets


def header_bytes(entries: list[TensorEntry], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for `entries` (padded to 8 bytes, as `save_file`)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or DEFAULT_METADATA)}
    offsets = _layout(entries)
    for entry in entries:
        if entry.dtype not in CODES:
            raise ValueError(f"safetensors: {entry.name} has dtype {entry.dtype}, not storable")
        code = CODES[entry.dtype]
        header[entry.name] = {
            "dtype": code,
            "shape": _header_shape(code, entry.shape),
            "data_offsets": list(offsets[entry.name]),
        }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


# --- reading the header -------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a file on disk: torch dtype and shape, absolute byte range."""

    name: str
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)


def _read_header(path: Path) -> tuple[dict[str, Any], int, int]:
    """The parsed JSON header, the data section's start and its length; bounds checked."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated, {size} bytes is less than a header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path}: header length {length} is over the {MAX_HEADER_BYTES}-byte limit; "
                "this is not a safetensors file"
            )
        if 8 + length > size:
            raise CheckpointError(
                f"{path}: header length {length} runs past the end of the {size}-byte file; "
                "the file is truncated"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw, object_pairs_hook=_unique_keys)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path}: header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return header, 8 + length, size - 8 - length


def _spec(path: Path, name: str, info: Any, base: int, data_len: int) -> TensorSpec:
    where = f"{path}: tensor {name}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise CheckpointError(f"{where} needs dtype, shape and data_offsets")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if code not in DTYPES:
        raise CheckpointError(f"{where} has unknown dtype {code!r}; known: {sorted(DTYPES)}")
    sizes = isinstance(shape, list) and all(map(_is_count, shape))
    torch_shape = _torch_shape(code, shape) if sizes else None
    if torch_shape is None:
        raise CheckpointError(f"{where} has shape {shape!r}, not a list of sizes fit for {code}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        raise CheckpointError(f"{where} has data_offsets {offsets!r}, not [start, end]")
    start, end = offsets
    if not start <= end <= data_len:
        raise CheckpointError(
            f"{where}: data_offsets [{start}, {end}] fall outside the {data_len}-byte data section"
        )
    expected = TensorEntry(name, DTYPES[code], torch_shape).nbytes
    if end - start != expected:
        raise CheckpointError(f"{where} spans {end - start} bytes; {code} {shape} needs {expected}")
    return TensorSpec(name, path, DTYPES[code], torch_shape, base + start, base + end)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_coverage(path: Path, specs: list[TensorSpec], base: int, data_len: int) -> None:
    """Ranges must tile the data section exactly, as the safetensors library demands."""
    cursor, previous = base, ""
    for spec in sorted(specs, key=lambda s: (s.start, s.end)):
        if spec.start != cursor:
            what = f"overlaps {previous}" if spec.start < cursor else "follows unused bytes"
            raise CheckpointError(f"{path}: tensor {spec.name} {what}")
        cursor, previous = spec.end, spec.name
    if cursor != base + data_len:
        raise CheckpointError(f"{path}: {base + data_len - cursor} bytes after the tensors")


def read_specs(path: Path) -> list[TensorSpec]:
    """Every tensor of one file, from a header checked against the file's size."""
    header, base, data_len = _read_header(path)
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: __metadata__ is not a JSON object")
    specs = [_spec(path, name, info, base, data_len) for name, info in header.items()]
    _check_coverage(path, specs, base, data_len)
    return specs
