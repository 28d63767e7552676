"""`NanogptDataset`: nanoGPT / modded-nanogpt token shards as fixed samples, map-style.

A shard is an int32[256] header then the tokens: `header[0]` the magic (20240520 for the
legacy fineweb.py shards, always uint16; 278895051 for nanogpt_data_processor.py shards,
whose `header[3]` is the bytes per token, 2 or 4), `header[1]` the version (1), `header[2]`
the token count. Shards are memory-mapped, so a rank reads only the pages of the samples it
serves, and the header's count is checked against the file size before any sample is cut.

Each shard is cut as AutoModel's iterable cuts it: consecutive windows of `seq_length + 1`
tokens (the collator's labels are the next tokens inside a window, so a window supervises
`seq_length` targets, AutoModel's `inputs = buf[:-1]`, `labels = buf[1:]`), the remainder
dropped; with `align_to_bos` a window starts only at a `bos_token`, the first one at or
after the previous window's end, found through the shard's `.bos.idx` (int32 token
positions) when present, else by one bounded-memory scan of the shard.

AutoModel streams the windows and splits shards between ranks and workers. Here the
windows of all shards, in file order, are indexed once, and tuneyard's resumable sampler
shuffles and shards them: every window is seen once per epoch either way, and the sampler's
position restores the exact data order on resume, which a stream could not.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from trainer.data.megatron_index import advise_random
from trainer.errors import data_error

MAGIC = 278895051
LEGACY_MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
_SCAN_TOKENS = 1 << 22  # tokens read per step when scanning a shard for BOS tokens


def shard_files(file_pattern: str | Sequence[str]) -> list[Path]:
    """The shards: a glob's matches, sorted, or the listed files in order."""
    if isinstance(file_pattern, str | Path):
        files = sorted(glob.glob(str(Path(file_pattern).expanduser())))
        if not files:
            raise data_error(
                f"dataset.file_pattern: {file_pattern!r} matches no file; point it at the .bin "
                "shards, e.g. data/fineweb_train_*.bin"
            )
        return [Path(f) for f in files]
    for name in file_pattern:
        if not Path(name).is_file():
            raise data_error(f"dataset.file_pattern: shard {name} does not exist")
    return [Path(name) for name in file_pattern]


def read_header(path: Path) -> tuple[np.dtype, int]:
    """The shard's token dtype and count, after checking magic, version and size."""
    with open(path, "rb") as stream:
        raw = stream.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise data_error(f"{path}: {len(raw)} bytes, shorter than the 1024-byte shard header")
    header = np.frombuffer(raw, dtype=np.int32)
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    if magic not in (MAGIC, LEGACY_MAGIC):
        raise data_error(
            f"{path}: magic number {magic} is neither {MAGIC} nor {LEGACY_MAGIC}; not a "
            "nanoGPT token shard"
        )
    if version != VERSION:
        raise data_error(f"{path}: shard version {version}; only version {VERSION} is read")
    width = 2 if magic == LEGACY_MAGIC else int(header[3])
    if width not in (2, 4):
        raise data_error(f"{path}: header[3] = {width} bytes per token; expected 2 or 4")
    dtype = np.dtype(np.uint16 if width == 2 else np.uint32)
    size = path.stat().st_size
    if count < 0 or size < HEADER_BYTES + count * width:
        raise data_error(
            f"{path}: the header announces {count} tokens ({HEADER_BYTES + count * width} "
            f"bytes with the header) but the file has {size} bytes; the shard is truncated"
        )
    return dtype, count


def _bos_positions(path: Path, dtype: np.dtype, count: int, bos: int) -> np.ndarray:
    """Token positions of `bos`: from `<shard>.bos.idx`, else by scanning the shard in
    chunks read from the file (not mapped), so the scan's memory stays one chunk."""
    index = path.with_suffix(".bos.idx")
    if index.is_file():
        positions = np.fromfile(index, dtype=np.int32).astype(np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= count):
            raise data_error(f"{index}: BOS positions fall outside the shard's {count} tokens")
        return np.sort(positions)
    found = []
    with open(path, "rb") as stream:
        stream.seek(HEADER_BYTES)
        for start in range(0, count, _SCAN_TOKENS):
            chunk = np.fromfile(stream, dtype=dtype, count=min(_SCAN_TOKENS, count - start))
            found.append(np.flatnonzero(chunk == bos) + start)
            _forget(stream.fileno(), HEADER_BYTES + start * dtype.itemsize, chunk.nbytes)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _forget(fd: int, offset: int, length: int) -> None:
    """Drop scanned pages from the page cache: left there (in large folios), every later
    sample's page fault would map a whole cached folio and the rank's resident set would
    grow to the shard's size."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def window_starts(bos_positions: np.ndarray, count: int, window: int) -> np.ndarray:
    """Starts of the BOS-aligned windows: each at the first BOS at or after the last end."""
    starts, pos = [], 0
    while True:
        at = int(np.searchsorted(bos_positions, pos))
        if at == len(bos_positions) or bos_positions[at] + window > count:
            return np.asarray(starts, dtype=np.int64)
        pos = int(bos_positions[at])
        starts.append(pos)
        pos += window


class NanogptDataset(Dataset):
    """Fixed windows of `seq_length + 1` tokens over nanoGPT shards (module docstring)."""

    def __init__(
        self,
        file_pattern: str | Sequence[str],
        seq_length: int,
        bos_token: int | None = None,
        shuffle_files: bool = False,
        align_to_bos: bool = False,
        drop_last: bool = True,
        infinite: bool = False,
    ):
        if align_to_bos and bos_token is None:
            raise data_error("dataset.bos_token: align_to_bos needs the BOS token id")
        self.window = seq_length + 1
        self.files = shard_files(file_pattern)
        self.dtypes, self.starts, counts = [], [], []
        for path in self.files:
            dtype, count = read_header(path)
            starts = None
            if align_to_bos:
                starts = window_starts(
                    _bos_positions(path, dtype, count, bos_token), count, self.window
                )
            self.dtypes.append((dtype, count))
            self.starts.append(starts)
            counts.append(count // self.window if starts is None else len(starts))
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        if self.offsets[-1] == 0:
            raise data_error(
                f"dataset.file_pattern: {len(self.files)} shard(s) hold no window of "
                f"{self.window} tokens; lower dataset.seq_length or add data"
            )
        self._maps: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _tokens(self, shard: int) -> np.ndarray:
        if shard not in self._maps:  # mapped on first use: a worker maps only what it reads
            dtype, count = self.dtypes[shard]
            self._maps[shard] = advise_random(
                np.memmap(self.files[shard], dtype, "r", offset=HEADER_BYTES, shape=(count,))
            )
        return self._maps[shard]

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        shard = int(np.searchsorted(self.offsets, index, side="right")) - 1
        local = index - int(self.offsets[shard])
        starts = self.starts[shard]
        start = local * self.window if starts is None else int(starts[local])
        ids = self._tokens(shard)[start : start + self.window].astype(np.int64).tolist()
        return {"input_ids": ids, "loss_mask": [1] * self.window}

    def shard_of(self, index: int) -> Path:
        """The shard sample `index` comes from (for tests and error messages)."""
        return self.files[int(np.searchsorted(self.offsets, index, side="right")) - 1]
