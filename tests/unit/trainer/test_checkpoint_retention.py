"""Retention on disk (`trainer.checkpoint.retention` through `CheckpointManager.publish`):
the k best by the metric each checkpoint recorded, the last `keep_last` and LATEST stay;
a new manager over the same directory (a resumed run) rebuilds the best set from disk."""

from __future__ import annotations

from pathlib import Path

from jobs.recipe.sections.retention import KeepBest
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.retention import apply_retention

BEST2 = KeepBest("val_loss", "min", 2)


def _publish(manager: CheckpointManager, step: int, val_loss: float | None) -> None:
    staging = manager.begin(step)
    (staging / "model").mkdir()
    metrics = {"loss": 1.0} if val_loss is None else {"loss": 1.0, "val_loss": val_loss}
    manager.publish(step, {"step": step, "metrics": metrics})


def _steps(root: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("step_")) for p in root.glob("step_*"))


def test_keep_best_and_keep_last_across_a_new_manager(tmp_path: Path) -> None:
    first = CheckpointManager(tmp_path, is_rank0=True, keep_last=1, keep_best=BEST2)
    for step, val in ((10, 3.0), (20, 1.0), (30, 2.5)):
        _publish(first, step, val)
    assert _steps(tmp_path / "checkpoints") == [20, 30]  # 10 is neither best nor latest
    _publish(first, 40, 2.0)  # 20, 40 best; 40 latest; 10 and 30 go
    assert _steps(tmp_path / "checkpoints") == [20, 40]
    deleted = first.take_deletions()
    assert [(d.step, "val_loss was" in d.reason) for d in deleted] == [(10, True), (30, True)]

    resumed = CheckpointManager(tmp_path, is_rank0=True, keep_last=1, keep_best=BEST2)
    _publish(resumed, 50, 5.0)  # worse than both: kept only while it is LATEST
    assert _steps(tmp_path / "checkpoints") == [20, 40, 50]
    _publish(resumed, 60, None)  # no validation at this step: LATEST, never ranked
    assert _steps(tmp_path / "checkpoints") == [20, 40, 60]
    assert [d.step for d in resumed.take_deletions()] == [50]
    assert resumed.take_deletions() == ()


def test_latest_is_never_deleted_even_unranked(tmp_path: Path) -> None:
    published = {}
    for step in (1, 2, 3):
        published[step] = tmp_path / f"step_{step}"
        published[step].mkdir()
    metrics = {1: {"val_loss": 1.0}, 2: {"val_loss": 2.0}, 3: None}
    deleted = apply_retention(published, metrics, 3, None, KeepBest("val_loss", "min", 1))
    assert [d.step for d in deleted] == [2]
    assert "recorded" not in deleted[0].reason and sorted(p.name for p in tmp_path.iterdir()) == [
        "step_1",
        "step_3",
    ]


def test_without_rules_nothing_is_deleted(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, is_rank0=True)
    for step in (1, 2, 3):
        _publish(manager, step, float(step))
    assert _steps(tmp_path / "checkpoints") == [1, 2, 3] and manager.take_deletions() == ()
