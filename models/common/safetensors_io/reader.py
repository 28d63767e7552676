"""Bounds-checked safetensors reader: tensors read straight into their destination.

Headers are checked (see `format.read_specs`) before any tensor is touched; then each
tensor's bytes go directly into its destination (`preadv` on the parameter's own storage
when dtypes match, one tensor-sized buffer when they do not); nothing is memory-mapped.
`SafetensorsReader` holds a whole checkpoint directory's specs and open shards.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from models.common.safetensors_io.format import CheckpointError, TensorSpec, read_specs
from models.common.safetensors_io.shards import checkpoint_files


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
