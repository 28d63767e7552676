"""`MegatronPretraining`: Megatron indexed token files, blended and split, as one map-style dataset.

`paths` names the data as AutoModel does: one prefix (or an existing `.bin`/`.idx` file, or
a glob of them), a list of prefixes, a blend `[weight, prefix, weight, prefix, ...]` (weights
as numbers or numeric strings, normalised), or a mapping `{train, validation, test}` of those
that gives each split its own data (then `split` is not used). Otherwise `split` ("99,1,0")
cuts each prefix's sequences into train / validation / test ranges, and `splits_to_build`
picks the split this dataset serves (`train` unless it names another).

Each prefix becomes a `SampleIndex` (`trainer.data.megatron_index`): shuffled documents,
fixed samples of `seq_length + 1` tokens. The collator shifts labels inside a sample, so a
sample supervises `seq_length` next-token targets, as Megatron's `tokens = text[:-1]`,
`labels = text[1:]` does; the model sees the extra last position, which has no target.
A blend interleaves its datasets by weight: the k-th sample of dataset i sits at the rank
of `(k + 0.5) / w_i` among all datasets' keys, so any prefix of the blend is within one
sample of the weights. Every index is a pure function of the files and the keywords, so a
resumed job sees the same samples at the same positions and the sampler's position is all
the resume state needed.
"""

from __future__ import annotations

import glob
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from trainer.data.megatron_index import IndexedTokens, IndexKey, SampleIndex
from trainer.errors import data_error

SPLITS = ("train", "validation", "test")
GLOB_CHARS = frozenset("*?[")
BLEND_SURPLUS = 0.005  # each blended dataset builds this many extra samples, as Megatron does


def parse_split(split: str | list[Any] | tuple[Any, ...]) -> list[tuple[float, float] | None]:
    """`"99,1,0"` -> [(0, .99), (.99, 1.0), None]: each split's fraction of the sequences."""
    text = ",".join(str(s) for s in split) if isinstance(split, list | tuple) else str(split)
    parts = [float(x) for x in re.findall(r"[.0-9]+", text)]
    if not parts or len(parts) > 3 or sum(parts) <= 0:
        raise data_error(f"dataset.split: {split!r} must be up to 3 weights, e.g. '99,1,0'")
    parts += [0.0] * (3 - len(parts))
    total, bounds, low = sum(parts), [], 0.0
    for part in parts:
        high = low + part / total
        bounds.append((low, high) if high > low else None)
        low = high
    return bounds


def _is_weight(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _prefix_of(value: str) -> str:
    """A prefix as given, or the prefix of an existing `.bin`/`.idx` file."""
    path = Path(value).expanduser()
    if path.suffix in (".bin", ".idx") and path.is_file():
        return str(path.with_suffix(""))
    return str(path)


def _glob_prefixes(pattern: str) -> list[str]:
    """AutoModel's string form: the unique prefixes of the `.bin`/`.idx` files a glob matches."""
    found = sorted(glob.glob(str(Path(pattern).expanduser())))
    prefixes = {str(Path(f).with_suffix("")) for f in found if f.endswith((".bin", ".idx"))}
    if not prefixes:
        raise data_error(f"dataset.paths: {pattern!r} matches no .bin or .idx file")
    return sorted(prefixes)


def parse_blend(paths: Any, loc: str = "dataset.paths") -> tuple[list[str], list[float] | None]:
    """Prefixes and weights (None: weigh by size) from a string or a (weighted) list."""
    if isinstance(paths, str | Path):
        text = str(paths)
        return (
            (_glob_prefixes(text), None) if GLOB_CHARS & set(text) else ([_prefix_of(text)], None)
        )
    if not isinstance(paths, list | tuple) or not paths:
        raise data_error(f"{loc}: must be a prefix, a list of prefixes or a weighted blend")
    if not _is_weight(paths[0]):
        return [_prefix_of(str(p)) for p in paths], None
    weights, prefixes = paths[0::2], paths[1::2]
    if len(weights) != len(prefixes) or not all(map(_is_weight, weights)):
        raise data_error(f"{loc}: a blend alternates weight and prefix: [30, a, 70, b]")
    numbers = [float(w) for w in weights]
    if any(w < 0 or not math.isfinite(w) for w in numbers) or sum(numbers) <= 0:
        raise data_error(f"{loc}: blend weights must be >= 0 with a positive sum")
    return [_prefix_of(str(p)) for p in prefixes], [w / sum(numbers) for w in numbers]


def blend_order(sizes: list[int], weights: list[float], total: int) -> tuple[np.ndarray, ...]:
    """(dataset, sample) of each of `total` blended samples, interleaved by weight."""
    keys, owners, ranks = [], [], []
    for dataset, weight in enumerate(weights):
        if weight <= 0:
            continue
        count = min(math.ceil(weight * total) + 1, total)
        k = np.arange(count, dtype=np.int64)
        keys.append((k + 0.5) / weight)
        owners.append(np.full(count, dataset, dtype=np.int16))
        ranks.append(k % max(1, sizes[dataset]))
    order = np.argsort(np.concatenate(keys), kind="stable")[:total]
    return np.concatenate(owners)[order], np.concatenate(ranks)[order]


class MegatronPretraining(Dataset):
    """Megatron `.bin`/`.idx` pretraining data; keywords as AutoModel's (module docstring)."""

    def __init__(
        self,
        paths: str | list[Any] | dict[str, Any],
        seq_length: int = 2048,
        tokenizer: Any = None,
        micro_batch_size: int = 4,
        global_batch_size: int = 8,
        create_attention_mask: bool = False,
        seed: int = 1234,
        split: str = "900,50,50",
        index_mapping_dir: str | None = None,
        num_dataset_builder_threads: int = 1,
        num_train_samples: int | None = None,
        num_val_samples: int | None = None,
        num_test_samples: int | None = None,
        trainer_max_steps: int | None = None,
        trainer_val_check_interval: int = 1000,
        trainer_limit_val_batches: int | float = 1,
        trainer_limit_test_batches: int | float = 1,
        mmap_bin_files: bool = True,
        dataloader_type: str | None = "single",
        splits_to_build: str | list[str] | None = None,
    ):
        self.split_name = _served_split(splits_to_build)
        self.seq_length = seq_length
        limits = (trainer_max_steps, global_batch_size, trainer_val_check_interval)
        counts = (num_train_samples, num_val_samples, num_test_samples)
        wanted = _wanted_samples(self.split_name, counts, limits, trainer_limit_val_batches)
        prefixes, weights, bounds = self._split_data(paths, split)
        sizes_wanted = _per_dataset(wanted, weights, len(prefixes))
        self.parts = []
        for prefix, want in zip(prefixes, sizes_wanted, strict=True):
            data = IndexedTokens(prefix)
            key = IndexKey(
                prefix,
                self.split_name,
                _range(data, bounds, prefix, self.split_name),
                seq_length,
                want,
                seed,
            )
            self.parts.append(SampleIndex(data, key, index_mapping_dir))
        sizes = [len(p) for p in self.parts]
        if weights is None:  # weigh by size: every dataset's full split, once
            weights = [s / sum(sizes) for s in sizes]
        total = wanted if wanted is not None else _largest_blend(sizes, weights)
        self.owner, self.rank = blend_order(sizes, weights, total)

    def _split_data(
        self, paths: Any, split: Any
    ) -> tuple[list[str], list[float] | None, tuple[float, float] | None]:
        """The served split's prefixes, weights and sequence fraction."""
        if isinstance(paths, dict):
            if self.split_name not in paths:
                raise data_error(
                    f"dataset.paths: gives no {self.split_name!r} data; add paths."
                    f"{self.split_name} or set splits_to_build"
                )
            loc = f"dataset.paths.{self.split_name}"
            return (*parse_blend(paths[self.split_name], loc), (0.0, 1.0))
        return (*parse_blend(paths), parse_split(split)[SPLITS.index(self.split_name)])

    def __len__(self) -> int:
        return len(self.owner)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        part = self.parts[int(self.owner[index])]
        ids = part.tokens(int(self.rank[index])).astype(np.int64).tolist()
        return {"input_ids": ids, "loss_mask": [1] * len(ids)}

    def source_of(self, index: int) -> str:
        """The prefix sample `index` comes from (for tests and error messages)."""
        return self.parts[int(self.owner[index])].data.prefix


def _served_split(splits_to_build: str | list[str] | None) -> str:
    names = [splits_to_build] if isinstance(splits_to_build, str) else list(splits_to_build or [])
    if len(names) > 1 or any(n not in SPLITS for n in names):
        raise data_error(
            f"dataset.splits_to_build: {splits_to_build!r}; name one of train, validation, test"
        )
    return names[0] if names else "train"


def _wanted_samples(
    split: str, counts: tuple[int | None, ...], limits: tuple[Any, ...], limit_val: int | float
) -> int | None:
    """AutoModel's sample counts: given, else derived from the trainer's steps, else one epoch."""
    train, val, test = counts
    max_steps, global_batch, val_interval = limits
    steps = None if max_steps in (None, -1) else int(max_steps)
    if split == "train":
        return train if train is not None else (steps * global_batch if steps else None)
    if split == "validation":
        if val is not None:
            return val
        if steps is None or (isinstance(limit_val, float) and limit_val <= 1.0):
            return None
        return int(steps // val_interval * limit_val * global_batch) or None
    return test


def _per_dataset(wanted: int | None, weights: list[float] | None, count: int) -> list[int | None]:
    if wanted is None or weights is None:
        return [wanted if count == 1 else None] * count
    return [math.ceil(w * wanted * (1 + BLEND_SURPLUS)) if w > 0 else 1 for w in weights]


def _range(
    data: IndexedTokens, bounds: tuple[float, float] | None, prefix: str, split: str
) -> tuple[int, int]:
    """The split's sequence range of one prefix (Megatron rounds each bookend)."""
    count = len(data.lengths)
    begin, end = (round(bounds[0] * count), round(bounds[1] * count)) if bounds else (0, 0)
    if end <= begin:
        raise data_error(
            f"dataset.split: gives the {split} split none of the {count} sequences of {prefix}; "
            "give it a larger share, or add data"
        )
    return begin, end


def _largest_blend(sizes: list[int], weights: list[float]) -> int:
    """Without a sample count: the largest blend that repeats no dataset's samples."""
    return max(1, min(int(s / w) for s, w in zip(sizes, weights, strict=True) if w > 0))
