"""Rows for the instruction and chat datasets, read through Hugging Face `datasets`, and their
tokenized form, cached.

`load_rows` turns a recipe's `path_or_dataset[_id]` into one `datasets.Dataset`: local
JSON/JSONL, CSV or Parquet files (one or a list), a `save_to_disk` directory, a directory of
data files, or a hub name read from the local hub cache (`trainer.data.hub`). A `split` picks
the base split and may slice it (`train[:100]`, `validation[10:20]`, `train[:5%]`); a file
holds one split, so its base name is not checked there (recipes write `split: validation` for
a validation file) but its slice applies. Rows are optionally shuffled (before the slice, so
disjoint slices of one seed never overlap) and limited.

`tokenized` runs a dataset's row function once through `Dataset.map` and keeps the result as
one Arrow file under the datasets cache dir (`<HF_DATASETS_CACHE>/tuneyard-tokenized/`), named
by a key of the source (file identity, hub snapshot, saved fingerprint), the tokenizer (its
vocabulary, merges, special tokens and chat template) and every argument that changes a
sample; the next run of the same job memory-maps that file and reads no source at all. A file
lock makes the ranks of one machine tokenize once. `TokenizedDataset` is the map-style view
the trainer indexes. Every failure is a `TrainerError(DATA_ERROR)` naming the source.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from trainer.data.hub import datasets_cache_dir, is_hub_dataset, snapshot_dir
from trainer.errors import data_error

# Bump when a row function's output for the same input changes: old cache files are not read.
CACHE_FORMAT = 1
FILE_FORMATS = {
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
_SPLIT = re.compile(r"^(?P<base>[A-Za-z0-9_.\-]+)(?:\[(?P<start>[^:\]]*):(?P<stop>[^\]]*)\])?$")
Sample = dict[str, list[int]]
RowFunction = Callable[[dict[str, Any], int], Sample | None]
RAW_COLUMN = "__json__"  # the one column of rows kept as JSON text


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise data_error("dataset: reading it needs the `datasets` package; install it") from None
    datasets.disable_progress_bars()  # one bar per map is noise in the worker's run log
    return datasets


@dataclass(frozen=True)
class Source:
    """Rows a recipe names, located but not yet read: a label for messages, an identity for
    the cache (what names the content without reading it), and how to read the rows."""

    label: str
    identity: dict[str, Any]
    read: Callable[[], Any]  # -> datasets.Dataset


@dataclass(frozen=True)
class SplitSpec:
    base: str
    start: str = ""
    stop: str = ""

    @property
    def sliced(self) -> bool:
        return bool(self.start or self.stop)


def parse_split(split: str | None, default: str = "train") -> SplitSpec:
    """`train`, `train[:100]`, `validation[10:]`, `train[:5%]` -> base name and slice bounds."""
    match = _SPLIT.match(split or default)
    if match is None:
        raise data_error(
            f"dataset.split: {split!r} is not a split name with an optional slice; "
            "write e.g. train, validation or train[:100]"
        )
    return SplitSpec(match["base"], (match["start"] or "").strip(), (match["stop"] or "").strip())


def _bound(text: str, n: int) -> int | None:
    if not text:
        return None
    try:
        value = round(float(text[:-1]) * n / 100) if text.endswith("%") else int(text)
    except ValueError:
        raise data_error(
            f"dataset.split: slice bound {text!r} is not an integer or a percentage"
        ) from None
    return value


def slice_positions(split: SplitSpec, n: int) -> range:
    """Row positions of the slice over n rows (Python slice rules: negative counts from the end)."""
    start, stop = _bound(split.start, n), _bound(split.stop, n)
    return range(n)[slice(start, stop)]


def _local_files(value: str | Sequence[str]) -> list[Path]:
    items = [value] if isinstance(value, str) else list(value)
    if not items or not all(isinstance(item, str) and item for item in items):
        raise data_error("dataset: give a file path, a list of file paths or a hub name")
    files = [Path(item).expanduser() for item in items]
    for file in files:
        if not file.exists():
            raise data_error(f"dataset: data file {file} does not exist; check the path")
    return files


def _format_of(files: list[Path]) -> str:
    formats = {FILE_FORMATS.get(f.suffix.lower()) for f in files}
    if None in formats or len(formats) != 1:
        names = ", ".join(sorted(FILE_FORMATS))
        raise data_error(
            f"dataset: {', '.join(map(str, files))}: read as one format from the suffix ({names})"
        )
    return formats.pop()


def _file_identity(files: list[Path]) -> list[list[Any]]:
    """What names a file's content without reading it: real path, size, modification time."""
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def _pick_split(loaded: Any, split: SplitSpec, label: str) -> Any:
    if split.base not in loaded:
        raise data_error(
            f"dataset: {label} has no split {split.base!r}; it has {sorted(loaded)}; "
            "set dataset.split to one of them"
        )
    return loaded[split.base]


def _is_saved_dir(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _saved_dir(path: Path, split: SplitSpec) -> Source:
    """A `save_to_disk` directory: one Dataset, or a DatasetDict whose split the recipe names."""

    def read() -> Any:
        datasets = _datasets()
        try:
            loaded = datasets.load_from_disk(str(path))
        except (OSError, ValueError) as exc:
            raise data_error(f"dataset: cannot read the saved dataset {path}: {exc}") from None
        if isinstance(loaded, datasets.DatasetDict):
            loaded = _pick_split(loaded, split, str(path))
        return loaded

    states = sorted(path.glob("**/state.json")) + sorted(path.glob("dataset_dict.json"))
    identity = {
        "saved": str(path.resolve()),
        "state": [s.read_text() for s in states],
        "split": split.base,
    }
    return Source(f"{path}[{split.base}]", identity, read)


def _builder_split(path: str, split: SplitSpec, name: str | None, label: str) -> Any:
    """One split of a data directory or hub snapshot through `load_dataset` (its configs)."""
    datasets = _datasets()
    try:
        return datasets.load_dataset(
            path, name=name, split=split.base, cache_dir=str(datasets_cache_dir())
        )
    except (ValueError, OSError, datasets.exceptions.DatasetsError) as exc:
        raise data_error(f"dataset: cannot read split {split.base!r} of {label}: {exc}") from None


def _hub(repo: str, split: SplitSpec, name: str | None, revision: str | None = None) -> Source:
    snapshot = snapshot_dir(repo, revision)  # the cached commit: its path names the content
    identity = {"hub": repo, "snapshot": str(snapshot), "config": name, "split": split.base}
    return Source(
        f"{repo}[{split.base}]", identity, lambda: _builder_split(str(snapshot), split, name, repo)
    )


def _directory(path: Path, split: SplitSpec, name: str | None) -> Source:
    if _is_saved_dir(path):
        return _saved_dir(path, split)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    identity = {"dir": _file_identity(files), "config": name, "split": split.base}
    return Source(
        f"{path}[{split.base}]", identity, lambda: _builder_split(str(path), split, name, str(path))
    )


def _files(files: list[Path], raw_json: bool) -> Source:
    label = ", ".join(map(str, files))
    fmt = _format_of(files)
    raw = raw_json and fmt == "json"
    identity = {"files": _file_identity(files), "raw_json": raw}

    def read() -> Any:
        if raw:
            return _raw_json_rows(files)
        datasets = _datasets()
        try:
            return datasets.load_dataset(
                fmt,
                data_files=[str(f) for f in files],
                split="train",
                cache_dir=str(datasets_cache_dir()),
            )
        except (ValueError, OSError, datasets.exceptions.DatasetsError) as exc:
            cause = exc.__cause__ or exc
            raise data_error(f"dataset: cannot read {label} as {fmt}: {cause}") from None

    return Source(label, identity, read)


def _raw_json_rows(files: list[Path]) -> Any:
    """JSON/JSONL rows kept as JSON text, one column: chat rows mix types (`arguments` as a
    string here and an object there, tool schemas of any shape) that Arrow cannot unify."""
    texts: list[str] = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        if file.suffix.lower() == ".json":
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise data_error(f"{file}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
            texts += [json.dumps(row) for row in (doc if isinstance(doc, list) else [doc])]
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    texts.append(json.dumps(json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise data_error(f"{file}:{number}: not valid JSON ({exc.msg})") from None
    return _datasets().Dataset.from_dict({RAW_COLUMN: texts})


def locate(
    path_or_id: str | Sequence[str],
    split: str | None,
    *,
    name: str | None = None,
    raw_json: bool = False,
    revision: str | None = None,
) -> tuple[Source, SplitSpec]:
    """The rows `path_or_id` names (files, a directory, a hub name in the cache) and the split.

    `raw_json`: JSON/JSONL files are parsed here, one JSON text per row, not by Arrow.
    `revision`: a hub name's branch, tag or commit (the default branch when None).
    """
    spec = parse_split(split)
    if isinstance(path_or_id, str) and is_hub_dataset(path_or_id):
        return _hub(path_or_id, spec, name, revision), spec
    if isinstance(path_or_id, str) and Path(path_or_id).expanduser().is_dir():
        return _directory(Path(path_or_id).expanduser(), spec, name), spec
    return _files(_local_files(path_or_id), raw_json), spec


def choose_positions(
    n: int, split: SplitSpec, shuffle_seed: int | None, limit: int | None
) -> list[int]:
    """Which source rows a dataset holds, in order: shuffled (seeded), sliced, limited."""
    order = list(range(n))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    chosen = [order[i] for i in slice_positions(split, n)]
    return chosen[:limit] if limit is not None else chosen


def tokenizer_identity(tokenizer: Any) -> str:
    """A digest of what decides token ids: vocabulary and merges, special tokens, chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = (
        backend.to_str()
        if backend is not None
        else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    )
    parts = [
        type(tokenizer).__name__,
        vocab,
        str(getattr(tokenizer, "chat_template", None)),
        json.dumps([tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]),
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def cache_key(kind: str, source: Source, tokenizer: Any, arguments: dict[str, Any]) -> str:
    payload = {
        "format": CACHE_FORMAT,
        "kind": kind,
        "source": source.identity,
        "tokenizer": tokenizer_identity(tokenizer),
        "arguments": arguments,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def cache_dir() -> Path:
    return datasets_cache_dir() / "tuneyard-tokenized"


def _run_rows(rows: Any, positions: list[int], row_fn: RowFunction, path: Path, key: str) -> Any:
    """Tokenize the chosen rows into the Arrow file at `path`; rows the function drops vanish.

    `row_fn` gets each row and its position in the source (for messages naming the row)."""
    chosen = rows.select(positions)

    def batch(columns: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"input_ids": [], "loss_mask": []}
        for offset, index in enumerate(indices):
            row = {name: values[offset] for name, values in columns.items()}
            if RAW_COLUMN in row:
                row = json.loads(row[RAW_COLUMN])
            sample = row_fn(row, positions[index])
            if sample is not None:
                out["input_ids"].append(sample["input_ids"])
                out["loss_mask"].append(sample["loss_mask"])
        return out

    return chosen.map(
        batch,
        batched=True,
        with_indices=True,
        remove_columns=chosen.column_names,
        cache_file_name=str(path),
        new_fingerprint=key[:32],
        load_from_cache_file=False,
    )


@dataclass(frozen=True)
class Selection:
    """Which rows of a source a dataset holds: the split's slice, shuffled first, limited."""

    split: SplitSpec
    shuffle_seed: int | None = None
    limit: int | None = None

    def positions(self, n: int) -> list[int]:
        return choose_positions(n, self.split, self.shuffle_seed, self.limit)

    def describe(self) -> dict[str, Any]:
        return {
            "slice": [self.split.start, self.split.stop],
            "shuffle_seed": self.shuffle_seed,
            "limit": self.limit,
        }


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """An exclusive lock on `lock` (other processes on this machine wait; released on exit,
    also when the process dies)."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tokenized(
    kind: str,
    source: Source,
    selection: Selection,
    row_fn: RowFunction,
    tokenizer: Any,
    arguments: dict[str, Any],
) -> Any:
    """The tokenized rows: read from the cache when this source, selection, tokenizer and
    arguments were tokenized before, else built once (under a lock, so the ranks of one
    machine do not all tokenize) and cached. A cache hit reads no source row."""
    datasets = _datasets()
    arguments = {**arguments, "selection": selection.describe()}
    key = cache_key(kind, source, tokenizer, arguments)
    path = cache_dir() / f"{key}.arrow"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_suffix(".lock")):
        if path.is_file():
            return datasets.Dataset.from_file(str(path))
        rows = source.read()
        return _run_rows(rows, selection.positions(len(rows)), row_fn, path, key)


class TokenizedDataset(Dataset):
    """The map-style dataset the trainer indexes: `{"input_ids", "loss_mask"}` lists per item."""

    def __init__(self, rows: Any, label: str):
        self.rows = rows
        self.label = label

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Sample:
        row = self.rows[int(index)]
        return {"input_ids": list(row["input_ids"]), "loss_mask": list(row["loss_mask"])}
