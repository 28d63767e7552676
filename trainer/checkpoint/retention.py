"""Which published checkpoints a run deletes after each save, and the record of each deletion.

The rule is `jobs.recipe.sections.retention.keep_reasons` (LATEST, the last `keep_last`,
the `keep_best` best by their metric). It is applied to what is on disk, not to what this
process remembers: each complete `step_<N>/` comes with the metrics its
`trainer_state.json` recorded at its step (`manager.recorded_metrics`), so a resumed run
(or a run whose earlier attempt pruned some already) rebuilds the same best set and keeps
the right ones. Rank 0 deletes; each deletion comes back as a `Deletion` the run log
writes as a `checkpoint_deleted` event, which the worker ingests.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.recipe.sections.retention import KeepBest, deletion_reason, keep_reasons


@dataclass(frozen=True)
class Deletion:
    """A checkpoint retention removed, and why."""

    step: int
    path: Path
    reason: str


def apply_retention(
    published: dict[int, Path],
    metrics: dict[int, dict[str, Any] | None],
    latest: int | None,
    keep_last: int | None,
    keep_best: KeepBest | None,
) -> list[Deletion]:
    """Delete the checkpoints of `published` (step -> complete directory) that no rule keeps,
    given what each recorded at its step (`metrics`). Never the one LATEST names
    (`latest`), which is also the one the run resumes from.
    """
    if keep_last is None and keep_best is None:
        return []
    reasons = keep_reasons(metrics, keep_last, keep_best, latest)
    why = deletion_reason(keep_last, keep_best)
    deleted = []
    for step in sorted(published):
        if reasons[step] or step == latest:
            continue
        shutil.rmtree(published[step], ignore_errors=True)
        deleted.append(Deletion(step, published[step], _detailed(why, metrics[step], keep_best)))
    return deleted


def _detailed(why: str, metrics: dict[str, Any] | None, keep_best: KeepBest | None) -> str:
    if keep_best is None:
        return why
    value = (metrics or {}).get(keep_best.metric)
    if value is None:
        return f"{why}; it recorded no {keep_best.metric} at its step"
    return f"{why}; its {keep_best.metric} was {value}"
