"""Peak RSS of reading Megatron and nanoGPT token files: a small corpus beside a large one.

Each case runs in a fresh subprocess: write (or reuse) a corpus under a temp dir, build the
dataset, read `--samples` samples spread over it, and report the growth of peak RSS over
the process's RSS just before the dataset was built. The datasets memory-map the token
files, so the growth should stay near flat while the corpus grows; the ratio large/small
is printed side by side (small/large in each column), with the growth split into
anonymous memory (heap: what the dataset allocates) and file-backed pages (the token
maps' resident pages, which the kernel may drop at any time). Run: `python bench/bench_pretrain_memory.py --large-gb 1`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DOC_TOKENS = 2048  # tokens per document (Megatron) / between BOS tokens (nanoGPT)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def write_corpus(root: Path, kind: str, tokens: int) -> str:
    """Token files of `tokens` uint16 tokens, written in chunks (bounded writer memory)."""
    sys.path.insert(0, str(REPO / "tests"))
    from token_corpora import write_megatron, write_nanogpt_shard

    root.mkdir(parents=True, exist_ok=True)
    docs = max(1, tokens // DOC_TOKENS)
    if kind == "megatron":
        prefix = root / "corpus_text_document"
        if not Path(f"{prefix}.idx").exists():
            write_megatron(prefix, [])  # header layout; then the real files, streamed
            _stream_megatron(prefix, docs)
        return str(prefix)
    shard = root / "fineweb_train_000000.bin"
    if not shard.exists():
        write_nanogpt_shard(shard, [])
        with open(shard, "r+b") as stream:
            stream.seek(8)
            stream.write(np.int32(docs * DOC_TOKENS).tobytes())
            stream.seek(1024)
            for chunk in _chunks(docs):
                stream.write(chunk.tobytes())
    return str(shard)


def _chunks(docs: int, per: int = 4096):
    rng = np.random.default_rng(0)
    for start in range(0, docs, per):
        n = min(per, docs - start)
        block = rng.integers(1, 50000, (n, DOC_TOKENS), dtype=np.uint16)
        block[:, 0] = 0  # BOS
        yield block


def _stream_megatron(prefix: Path, docs: int) -> None:
    import struct

    with open(f"{prefix}.bin", "wb") as stream:
        for chunk in _chunks(docs):
            stream.write(chunk.tobytes())
    lengths = np.full(docs, DOC_TOKENS, dtype=np.int32)
    pointers = np.arange(docs, dtype=np.int64) * DOC_TOKENS * 2
    with open(f"{prefix}.idx", "wb") as stream:
        stream.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, docs, docs + 1))
        stream.write(lengths.tobytes() + pointers.tobytes())
        stream.write(np.arange(docs + 1, dtype=np.int64).tobytes())


def measure(kind: str, path: str, samples: int, seq: int) -> dict[str, float]:
    import trainer.data.megatron  # noqa: F401  (imports before the baseline)
    import trainer.data.nanogpt  # noqa: F401

    before = {f: _status_mb(f) for f in ("VmRSS", "RssAnon", "RssFile")}
    if kind == "megatron":
        from trainer.data.megatron import MegatronPretraining

        ds = MegatronPretraining(paths=path, seq_length=seq, split="99,1,0", seed=1)
    else:
        from trainer.data.nanogpt import NanogptDataset

        ds = NanogptDataset(path, seq_length=seq, bos_token=0, align_to_bos=True)
    for i in np.linspace(0, len(ds) - 1, samples).astype(int):
        ds[int(i)]
    return {
        "samples_in_dataset": len(ds),
        "rss_before_mb": before["VmRSS"],
        "peak_growth_mb": _peak_mb() - before["VmRSS"],
        "anon_growth_mb": _status_mb("RssAnon") - before["RssAnon"],
        "file_growth_mb": _status_mb("RssFile") - before["RssFile"],
    }


def _evict(directory: Path) -> None:
    """Drop the corpus from the page cache, as a corpus on disk is before a job reads it:
    pages the writer left cached (in large folios) would otherwise be mapped whole."""
    import os

    for file in directory.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _case(kind: str, tokens: int, root: Path, samples: int, seq: int) -> dict:
    path = write_corpus(root / f"{kind}-{tokens}", kind, tokens)
    _evict(Path(path).parent)
    code = (
        f"import json,sys; sys.path.insert(0, {str(REPO)!r}); "
        f"from bench.bench_pretrain_memory import measure; "
        f"print(json.dumps(measure({kind!r}, {path!r}, {samples}, {seq})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO
    ).stdout
    corpus_mb = sum(f.stat().st_size for f in Path(path).parent.iterdir()) / 2**20
    return {**json.loads(out.strip().splitlines()[-1]), "corpus_mb": corpus_mb}


def _pair(small: dict, large: dict):
    return lambda key, spec: f"{small[key]:{spec}}/{large[key]:{spec}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-mb", type=float, default=16)
    parser.add_argument("--large-gb", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--dir", type=Path, default=None, help="corpus dir (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        sizes = {"small": int(args.small_mb * 2**19), "large": int(args.large_gb * 2**29)}
        print(
            f"{'dataset':<9} {'corpus MB':>15} {'samples':>15} {'peak RSS +MB':>15} "
            f"{'anon +MB':>13} {'file +MB':>13} {'peak ratio':>10}"
        )
        for kind in ("megatron", "nanogpt"):
            small, large = (
                _case(kind, n, root, args.samples, args.seq_length) for n in sizes.values()
            )
            ratio = large["peak_growth_mb"] / max(small["peak_growth_mb"], 1e-9)
            pair = _pair(small, large)
            print(
                f"{kind:<9} {pair('corpus_mb', '.0f'):>15} "
                f"{pair('samples_in_dataset', 'd'):>15} {pair('peak_growth_mb', '.1f'):>15} "
                f"{pair('anon_growth_mb', '.1f'):>13} {pair('file_growth_mb', '.1f'):>13} "
                f"{ratio:>10.2f}"
            )


if __name__ == "__main__":
    main()
