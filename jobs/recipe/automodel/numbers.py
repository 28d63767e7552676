"""Numbers written as strings (`eps: "1e-8"`), read as the numbers they spell.

AutoModel's config loader turns every string that spells a Python literal into that value,
so a quoted `"1e-8"` (or one from JSON, or a YAML 1.1 reader's unquoted `1e-8`) reaches its
optimizer as a float. tuneyard's trainer passes keyword values as they are stored, so a
string would validate and then fail inside the optimizer. `fold_numeric_strings` rewrites,
in the raw recipe before any check, the strings that spell an integer or a finite decimal
number where the keyword takes a number: every keyword of the optimizer, LR scheduler and
loss sections (their parameters are numbers, flags and a few word choices such as
`reduction: mean`, which no number spells), and the numeric keywords of the datasets (sizes,
lengths, counts, seeds). Lists of them (`betas: ["0.9", "0.95"]`) too. Nothing else is
touched: a path, a split or a column name that looks like a number stays text.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jobs.recipe.sections.values import DATASET_NUMBER_KEYS

_INT = re.compile(r"\A[-+]?\d+\Z")
_DECIMAL = re.compile(r"\A[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\Z")
NUMERIC_SECTIONS = ("optimizer", "lr_scheduler", "loss_fn", "kd_loss_fn")
DATASET_SECTIONS = ("dataset", "validation_dataset")
# AutoModel's spellings of the dataset numbers (folded onto ours later) and the mock's.
DATASET_NUMBERS = frozenset({*DATASET_NUMBER_KEYS, "seq_len", "num_samples_limit", "batch_size"})


def spelled_number(value: str) -> int | float | None:
    """The number `value` spells (`"1e-8"`, `"64"`, `"-0.5"`), or None."""
    text = value.strip()
    if _INT.match(text) and len(text) <= 20:
        return int(text)
    if _DECIMAL.match(text):
        number = float(text)
        return number if math.isfinite(number) else None
    return None


def _as_number(value: Any) -> Any:
    if isinstance(value, str):
        number = spelled_number(value)
        return value if number is None else number
    if isinstance(value, list):
        return [_as_number(item) for item in value]
    return value


def _fold_keys(section: Any, keys: frozenset[str] | None) -> None:
    if not isinstance(section, dict):
        return
    for key, value in section.items():
        if key != "_target_" and (keys is None or key in keys):
            section[key] = _as_number(value)


def fold_numeric_strings(data: dict[str, Any]) -> None:
    """Rewrite numbers spelled as strings into numbers, in place (see the module)."""
    for name in NUMERIC_SECTIONS:
        _fold_keys(data.get(name), None)
    for name in DATASET_SECTIONS:
        _fold_keys(data.get(name), DATASET_NUMBERS)
