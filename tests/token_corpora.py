"""Writers of real token-file formats for tests: Megatron `.bin`/`.idx` and nanoGPT shards.

`write_megatron` writes the MMIDIDX index byte by byte with `struct` (magic, u64 version,
u8 dtype code, u64 sequence and document counts, int32 lengths, int64 byte pointers, int64
document indices), independent of the reader in `trainer.data.megatron_index`.
`write_nanogpt_shard` writes the 256-int32 header (magic, version, count, bytes per token)
and the tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

MEGATRON_DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
                        np.uint16: 8}  # fmt: skip
NANOGPT_MAGIC, NANOGPT_LEGACY_MAGIC = 278895051, 20240520


def write_megatron(
    prefix: Path, documents: Sequence[Sequence[int]], dtype: type = np.uint16
) -> Path:
    """One sequence per document, as Megatron's GPT preprocessing writes text documents."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    itemsize = np.dtype(dtype).itemsize
    lengths = [len(d) for d in documents]
    pointers, at = [], 0
    for length in lengths:
        pointers.append(at)
        at += length * itemsize
    with open(f"{prefix}.bin", "wb") as stream:
        for document in documents:
            stream.write(np.asarray(document, dtype=dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as stream:
        stream.write(b"MMIDIDX\x00\x00")
        stream.write(struct.pack("<Q", 1))
        stream.write(struct.pack("<B", MEGATRON_DTYPE_CODES[dtype]))
        stream.write(struct.pack("<Q", len(lengths)))
        stream.write(struct.pack("<Q", len(lengths) + 1))
        stream.write(struct.pack(f"<{len(lengths)}i", *lengths))
        stream.write(struct.pack(f"<{len(pointers)}q", *pointers))
        stream.write(struct.pack(f"<{len(lengths) + 1}q", *range(len(lengths) + 1)))
    return prefix


def write_nanogpt_shard(
    path: Path, tokens: Sequence[int] | np.ndarray, *, legacy: bool = False, width: int = 2
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = np.zeros(256, dtype=np.int32)
    header[0] = NANOGPT_LEGACY_MAGIC if legacy else NANOGPT_MAGIC
    header[1], header[2] = 1, len(tokens)
    header[3] = 0 if legacy else width
    dtype = np.uint16 if legacy or width == 2 else np.uint32
    with open(path, "wb") as stream:
        stream.write(header.tobytes())
        stream.write(np.asarray(tokens, dtype=dtype).tobytes())
    return path


def counting_documents(count: int, length: int, start: int = 0, vocab: int = 500) -> list:
    """Documents whose tokens count up through the corpus (`start + i*length + t`, modulo
    `vocab`), so a token tells where in the stream it sits."""
    return [[(start + i * length + t) % vocab for t in range(length)] for i in range(count)]


def learnable_documents(count: int, length: int, low: int, high: int, seed: int = 0) -> list:
    """Documents of a repeating pattern in [low, high): next tokens a tiny model learns fast."""
    rng = np.random.default_rng(seed)
    span = high - low
    docs = []
    for _ in range(count):
        first = int(rng.integers(0, span))
        docs.append([low + (first + t) % span for t in range(length)])
    return docs
