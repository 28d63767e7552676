"""The one safetensors reader and writer: checked headers, streamed tensors, HF shards.

A safetensors file is an 8-byte little-endian header length, a JSON header (dtype, shape
and data offsets of every tensor) and the data section. Reading validates the header
against the file before any tensor is touched (length sane and inside the file, offsets
inside the data section, covering it without overlap or gap, each range exactly
shape x dtype bytes) and then reads each tensor's bytes straight into its destination
(`preadv` on the parameter's own storage when dtypes match, one tensor-sized buffer when
they do not); nothing is memory-mapped. Writing computes the header from shapes and dtypes
alone, so each tensor can be produced, written and dropped in turn: peak extra memory is
one tensor, not the model. Files are laid out as `safetensors.torch.save_file` lays them
out, and shards plus `model.safetensors.index.json` as transformers writes them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_METADATA = {"format": "pt"}  # transformers refuses files whose format is not "pt"
# The safetensors library refuses headers past 100 MB; so do we, before allocating one.
MAX_HEADER_BYTES = 100_000_000
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu, "F4": torch.float4_e2m1fn_x2,
}  # fmt: skip
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


# --- writing ------------------------------------------------------------------------------
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


# --- reading ------------------------------------------------------------------------------
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


def _read_exact(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise CheckpointError(f"unexpected end of file at byte {offset + done}")
        done += n


def reads_in_place(spec: TensorSpec, dest: torch.Tensor) -> bool:
    """True when the bytes can go straight into `dest` (no conversion buffer)."""
    return dest.dtype == spec.dtype and dest.is_contiguous() and dest.device.type == "cpu"


def read_into(spec: TensorSpec, dest: torch.Tensor, fd: int) -> None:
    """Fill `dest` (same shape, any dtype or device) with the tensor's values."""
    if tuple(dest.shape) != spec.shape:
        raise CheckpointError(
            f"{spec.name}: checkpoint shape {spec.shape} != model {tuple(dest.shape)}"
        )
    direct = reads_in_place(spec, dest)
    target = dest.detach() if direct else torch.empty(spec.shape, dtype=spec.dtype)
    if spec.end > spec.start:
        raw = target.reshape(-1).view(torch.uint8).numpy()
        _read_exact(fd, memoryview(raw).cast("B"), spec.start)
    if not direct:
        with torch.no_grad():
            dest.copy_(target)


def read_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of one file as a new CPU tensor, one at a time, in file order."""
    specs = sorted(read_specs(path), key=lambda s: s.start)
    fd = os.open(path, os.O_RDONLY)
    try:
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=spec.dtype)
            read_into(spec, tensor, fd)
            yield spec.name, tensor
    finally:
        os.close(fd)


# --- directories --------------------------------------------------------------------------
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


def directory_specs(directory: Path) -> dict[str, TensorSpec]:
    """Every tensor of a checkpoint directory by name; a name in two shards is refused."""
    specs: dict[str, TensorSpec] = {}
    for path in checkpoint_files(directory):
        for spec in read_specs(path):
            if spec.name in specs:
                raise CheckpointError(
                    f"{directory}: tensor {spec.name} is in both "
                    f"{specs[spec.name].path.name} and {path.name}"
                )
            specs[spec.name] = spec
    return specs


def iter_safetensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a checkpoint directory, one at a time (the caller drops each)."""
    for path in checkpoint_files(directory):
        yield from read_tensors(path)


class SafetensorsReader:
    """A directory's checked specs and open shards; `read_into(name, dest)` one at a time."""

    def __init__(self, directory: Path) -> None:
        self.specs = directory_specs(directory)
        self._fds: dict[Path, int] = {}

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        spec = self.specs[name]
        read_into(spec, dest, self._fd(spec.path))

    def read_many(self, items: Iterable[tuple[str, torch.Tensor]], threads: int = 4) -> None:
        """Read many tensors. In-place reads overlap on a few threads (preadv releases the
        GIL); reads that convert dtype run one at a time, so at most one tensor-sized buffer
        exists at once."""
        items = list(items)
        for name, _ in items:  # open every shard first: the fd table is not thread-safe
            self._fd(self.specs[name].path)
        direct = [(n, d) for n, d in items if reads_in_place(self.specs[n], d)]
        for name, dest in items:
            if not reads_in_place(self.specs[name], dest):
                self.read_into(name, dest)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            list(pool.map(lambda item: self.read_into(*item), direct))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
