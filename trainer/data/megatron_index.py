"""Megatron indexed token files (`<prefix>.bin` + `<prefix>.idx`) and the sample index over them.

`IndexedTokens` reads one prefix. The `.idx` file is the MMIDIDX layout Megatron-Core's
indexed dataset writes: the 9-byte magic `MMIDIDX\\x00\\x00`, a little-endian u64 version (1),
a u8 token dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
8 uint16), u64 sequence count S, u64 document count D, then int32[S] sequence lengths,
int64[S] byte pointers into `.bin`, and int64[D] document indices (sequence numbers that
bound documents, 0 first, S last). `.bin` is the raw tokens. Both are memory-mapped: a
sample reads only its own pages, so a rank's memory does not grow with the corpus.

`SampleIndex` is the GPT sample layout over one prefix's split: the split's sequences,
shuffled per epoch with `numpy.random.RandomState(seed)`, form one token stream; sample j
is the `seq_length + 1` tokens starting at stream position `j * seq_length` (consecutive
samples share one token, so every input position has its next-token target), a partial
last sample is dropped, and samples are then shuffled. Its arrays grow with the number of
sequences and samples (about 16 bytes per sequence and 4 per sample), never with tokens;
with an `index_mapping_dir` they are saved once and memory-mapped on later loads.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.errors import data_error

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
HEADER_BYTES = 9 + 8 + 1 + 8 + 8
TOKEN_DTYPES: dict[int, type[np.integer]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    8: np.uint16,
}  # codes 6 and 7 are float64 and float32: not token ids
_INDEX_FORMAT = 1  # bump when the saved arrays change meaning


class IndexedTokens:
    """One `<prefix>.bin`/`<prefix>.idx` pair, checked and memory-mapped."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.idx_path, self.bin_path = Path(prefix + ".idx"), Path(prefix + ".bin")
        for file in (self.idx_path, self.bin_path):
            if not file.is_file():
                raise data_error(
                    f"dataset.paths: {file} does not exist; a Megatron prefix names a "
                    f"{self.idx_path.name} and {self.bin_path.name} pair"
                )
        self.dtype, count, docs = self._read_header()
        index = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        need = HEADER_BYTES + count * 12 + docs * 8
        if index.size < need:
            raise data_error(
                f"{self.idx_path}: truncated index: its header announces {count} sequences and "
                f"{docs - 1} documents ({need} bytes) but the file has {index.size} bytes"
            )
        self.lengths = np.frombuffer(index, np.int32, count, HEADER_BYTES)
        self.pointers = np.frombuffer(index, np.int64, count, HEADER_BYTES + count * 4)
        self.document_indices = np.frombuffer(index, np.int64, docs, HEADER_BYTES + count * 12)
        self.tokens = self._map_tokens()
        self._check_pointers()

    def _read_header(self) -> tuple[np.dtype, int, int]:
        with open(self.idx_path, "rb") as stream:
            header = stream.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES or header[:9] != INDEX_MAGIC:
            raise data_error(
                f"{self.idx_path}: not a Megatron index (no MMIDIDX header); rebuild it with "
                "Megatron's preprocess_data.py"
            )
        version, code, count, docs = struct.unpack("<QBQQ", header[9:])
        if version != INDEX_VERSION:
            raise data_error(f"{self.idx_path}: index version {version}; only version 1 is read")
        if code not in TOKEN_DTYPES:
            raise data_error(f"{self.idx_path}: token dtype code {code} is not an integer type")
        return np.dtype(TOKEN_DTYPES[code]), count, docs

    def _map_tokens(self) -> np.ndarray:
        size = self.bin_path.stat().st_size
        if size % self.dtype.itemsize:
            raise data_error(
                f"{self.bin_path}: {size} bytes is not a whole number of {self.dtype} tokens"
            )
        if size == 0:
            return np.zeros(0, dtype=self.dtype)
        return advise_random(np.memmap(self.bin_path, dtype=self.dtype, mode="r"))

    def _check_pointers(self) -> None:
        """Every sequence inside `.bin`, documents bounded by 0 and the sequence count."""
        count, itemsize = len(self.lengths), self.dtype.itemsize
        if count and (self.lengths.min() < 0 or self.pointers.min() < 0):
            raise data_error(f"{self.idx_path}: negative sequence lengths or pointers")
        ends = self.pointers + self.lengths.astype(np.int64) * itemsize
        if count and ends.max() > self.tokens.size * itemsize:
            bad = int(np.argmax(ends > self.tokens.size * itemsize))
            raise data_error(
                f"{self.bin_path}: sequence {bad} ends at byte {int(ends[bad])} but the file "
                f"has {self.tokens.size * itemsize} bytes; the .bin is truncated or not this "
                "index's"
            )
        docs = self.document_indices
        if len(docs) == 0 or docs[0] != 0 or docs[-1] != count or np.any(np.diff(docs) < 0):
            raise data_error(
                f"{self.idx_path}: document indices must rise from 0 to the sequence count "
                f"({count})"
            )

    def read(self, sequence: int, offset: int, length: int) -> np.ndarray:
        start = int(self.pointers[sequence]) // self.dtype.itemsize + offset
        return self.tokens[start : start + length]


def advise_random(tokens: np.ndarray) -> np.ndarray:
    """Tell the kernel a token map is read at random: without it every sample's page fault
    reads ahead hundreds of KB, and a rank's resident set grows with the corpus it samples."""
    mapped = getattr(tokens, "_mmap", None)
    if mapped is not None and hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_RANDOM)
    return tokens


@dataclass(frozen=True)
class IndexKey:
    """What a sample index depends on; its hash names the saved files."""

    prefix: str
    split: str
    sequences: tuple[int, int]  # the split's sequence range [begin, end)
    seq_length: int
    num_samples: int | None
    seed: int

    def digest(self, idx: Path) -> str:
        info = idx.stat()
        fields = {**self.__dict__, "idx_size": info.st_size, "idx_mtime_ns": info.st_mtime_ns}
        text = json.dumps({**fields, "format": _INDEX_FORMAT}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


class SampleIndex:
    """Samples of `seq_length + 1` tokens over one prefix's split (module docstring)."""

    def __init__(self, data: IndexedTokens, key: IndexKey, cache_dir: str | None):
        self.data, self.seq_length = data, key.seq_length
        arrays = _load(cache_dir, key, data.idx_path) if cache_dir else None
        if arrays is None:
            arrays = _build(data, key)
            if cache_dir:
                _save(cache_dir, key, data.idx_path, arrays)
        self.documents, self.starts, self.shuffle = arrays
        total = len(self.shuffle)
        self.length = total if key.num_samples is None else min(key.num_samples, total)

    def __len__(self) -> int:
        return self.length

    def tokens(self, index: int) -> np.ndarray:
        """The `seq_length + 1` tokens of sample `index` (after the sample shuffle)."""
        begin = int(self.shuffle[index]) * self.seq_length
        end = begin + self.seq_length + 1
        first = int(np.searchsorted(self.starts, begin, side="right")) - 1
        parts, doc = [], first
        while True:
            lo, hi = int(self.starts[doc]), int(self.starts[doc + 1])
            take = min(hi, end) - max(lo, begin)
            parts.append(self.data.read(int(self.documents[doc]), max(lo, begin) - lo, take))
            if hi >= end:
                break
            doc += 1
        return np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def _build(data: IndexedTokens, key: IndexKey) -> Arrays:
    """Document order, stream offsets and sample shuffle, as Megatron's GPT index builds them."""
    begin, end = key.sequences
    sequences = np.arange(begin, end, dtype=np.int32)
    per_epoch = int(data.lengths[begin:end].sum(dtype=np.int64))
    length = key.seq_length
    if per_epoch <= length:
        raise data_error(
            f"{data.prefix}: the {key.split} split holds {per_epoch} tokens, not enough for one "
            f"sample of {length + 1}; add data or lower dataset.seq_length"
        )
    epochs = 1
    if key.num_samples is not None:
        epochs = max(1, -(-(key.num_samples * length + 1) // per_epoch))
    rng = np.random.RandomState(key.seed)
    sans_final = (((epochs - 1) * per_epoch) - 1) // length if epochs > 1 else 0
    separate = False
    if epochs > 1:
        per_epoch_samples = (per_epoch - 1) // length
        separate = key.num_samples - sans_final < int(0.80 * per_epoch_samples)
    documents = _document_order(sequences, epochs, rng, separate)
    starts = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum(data.lengths[documents], dtype=np.int64, out=starts[1:])
    total = int((starts[-1] - 1) // length)
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = sans_final if separate else total
    shuffle = np.arange(total, dtype=dtype)
    rng.shuffle(shuffle[:first])
    if first < total:
        rng.shuffle(shuffle[first:])
    return documents, starts, shuffle


def _document_order(
    sequences: np.ndarray, epochs: int, rng: np.random.RandomState, separate: bool
) -> np.ndarray:
    """`epochs` copies of the split's sequences, shuffled together (the last one apart when
    it is a small remainder, so its few samples do not all come from one region)."""
    if separate and epochs > 1:
        head = _document_order(sequences, epochs - 1, rng, False)
        return np.concatenate([head, _document_order(sequences, 1, rng, False)])
    order = np.tile(sequences, epochs).astype(np.int32)
    rng.shuffle(order)
    return order


_NAMES = ("documents", "starts", "shuffle")


def _paths(cache_dir: str, key: IndexKey, idx: Path) -> list[Path]:
    stem = f"{Path(key.prefix).name}-{key.split}-{key.digest(idx)}"
    return [Path(cache_dir) / f"{stem}-{name}.npy" for name in _NAMES]


def _load(cache_dir: str, key: IndexKey, idx: Path) -> Arrays | None:
    files = _paths(cache_dir, key, idx)
    if not all(f.is_file() for f in files):
        return None
    try:
        loaded = [np.load(f, mmap_mode="r", allow_pickle=False) for f in files]
    except (OSError, ValueError):
        return None  # a damaged cache is rebuilt, never trusted
    return loaded[0], loaded[1], loaded[2]


def _save(cache_dir: str, key: IndexKey, idx: Path, arrays: Arrays) -> None:
    """Each file written under a private name, then renamed: ranks racing to save write the
    same bytes, and a reader never sees half a file."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
        for file, array in zip(_paths(cache_dir, key, idx), arrays, strict=True):
            staging = file.with_name(f".{file.name}.{os.getpid()}.tmp")
            with open(staging, "wb") as stream:
                np.save(stream, np.ascontiguousarray(array), allow_pickle=False)
            os.replace(staging, file)
    except OSError as exc:
        raise data_error(f"dataset.index_mapping_dir: cannot write {cache_dir} ({exc})") from None
