"""Safetensors I/O without model-sized temporaries.

Reading parses the safetensors header and reads each tensor's bytes straight into the
destination parameter (`readinto` on its storage) when dtypes match, or through one
tensor-sized buffer when they do not; nothing is memory-mapped, so resident memory grows by
the model's own parameters only. Writing computes the header from shapes and dtypes, then
streams tensors one at a time, sharding by size with a `model.safetensors.index.json`
exactly as transformers writes it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_DTYPE_CODES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
_CODE_OF = {dtype: code for code, dtype in _DTYPE_CODES.items()}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read: missing, malformed or mismatched."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files of a directory: the single file, or the index's shards."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [directory / name for name in dict.fromkeys(weight_map.values())]
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


def read_specs(path: Path) -> list[TensorSpec]:
    """Tensor names, dtypes, shapes and byte ranges from one file's header."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    base = 8 + header_len
    specs = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPE_CODES:
            raise CheckpointError(
                f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}"
            )
        start, end = info["data_offsets"]
        specs.append(
            TensorSpec(
                name,
                path,
                _DTYPE_CODES[info["dtype"]],
                tuple(info["shape"]),
                base + start,
                base + end,
            )
        )
    return specs


def directory_specs(directory: Path) -> dict[str, TensorSpec]:
    return {s.name: s for path in checkpoint_files(directory) for s in read_specs(path)}


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
    """Fill `dest` (CPU, same shape) with the tensor's values, converting dtype if needed."""
    if tuple(dest.shape) != spec.shape:
        raise CheckpointError(
            f"{spec.name}: checkpoint shape {spec.shape} != model {tuple(dest.shape)}"
        )
    nbytes = spec.end - spec.start
    if reads_in_place(spec, dest):
        target = dest.detach()
    else:
        target = torch.empty(spec.shape, dtype=spec.dtype)
    if nbytes:
        raw = target.view(-1).view(torch.uint8).numpy()
        _read_exact(fd, memoryview(raw).cast("B"), spec.start)
    if target is not dest:
        with torch.no_grad():
            dest.copy_(target)


class SafetensorsReader:
    """Open file descriptors for a directory's shards; `read_into(name, dest)` one at a time."""

    def __init__(self, directory: Path) -> None:
        self.specs = directory_specs(directory)
        self._fds: dict[Path, int] = {}

    def read_into(self, name: str, dest: torch.Tensor) -> None:
        spec = self.specs[name]
        if spec.path not in self._fds:
            self._fds[spec.path] = os.open(spec.path, os.O_RDONLY)
        read_into(spec, dest, self._fds[spec.path])

    def read_many(self, items: Iterable[tuple[str, torch.Tensor]], threads: int = 4) -> None:
        """Read many tensors. In-place reads overlap on a few threads (preadv releases the
        GIL); reads that convert dtype run one at a time, so at most one tensor-sized buffer
        exists at once."""
        items = list(items)
        for name, _ in items:  # open every shard first: the fd table is not thread-safe here
            path = self.specs[name].path
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY)
        direct = [(n, d) for n, d in items if reads_in_place(self.specs[n], d)]
        for name, dest in items:  # conversions one at a time: one buffer alive at most
            if not reads_in_place(self.specs[name], dest):
                self.read_into(name, dest)
        if threads <= 1 or len(direct) < 2:
            for name, dest in direct:
                self.read_into(name, dest)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            for future in [pool.submit(self.read_into, n, d) for n, d in direct]:
                future.result()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _header(items: list[tuple[str, torch.Tensor]]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in items:
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _CODE_OF[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def write_file(path: Path, items: list[tuple[str, torch.Tensor]]) -> None:
    """Write one safetensors file, streaming each tensor's bytes (no concatenated copy)."""
    header = _header(items)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for _, tensor in items:
            data = tensor.detach().cpu().contiguous()
            if data.numel():
                f.write(data.view(-1).view(torch.uint8).numpy())


def _shards(items: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[list]:
    shard: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > max_bytes:
            yield shard
            shard, size = [], 0
        shard.append((name, tensor))
        size += nbytes
    if shard:
        yield shard


def save_safetensors(
    directory: Path, items: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int = 5 * 2**30
) -> list[Path]:
    """Write `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards plus an index."""
    directory.mkdir(parents=True, exist_ok=True)
    shards = list(_shards(items, max_shard_bytes))
    if len(shards) <= 1:
        write_file(directory / SINGLE_FILE, shards[0] if shards else [])
        return [directory / SINGLE_FILE]
    paths, weight_map, total = [], {}, 0
    for i, shard in enumerate(shards, start=1):
        path = directory / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_file(path, shard)
        paths.append(path)
        for name, tensor in shard:
            weight_map[name] = path.name
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
    return paths
