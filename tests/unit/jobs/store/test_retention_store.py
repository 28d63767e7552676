"""`policy_deletions`, the pure rule of a project's checkpoint retention policy: age first,
then the oldest finished jobs' checkpoints (lowest step first) until max_bytes holds;
protected checkpoints are never chosen but their bytes still count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobs.store.retention import StoredCheckpoint, policy_deletions

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def ckpt(job: str, step: int, days_ago: float, size: int = 100, *protected: str):
    return StoredCheckpoint(
        job, step, f"/r/{job}/step_{step}", size, NOW - timedelta(days_ago), protected
    )


def chosen(*args) -> list[tuple[str, int]]:
    return [(c.job_id, c.step) for c, _ in policy_deletions(*args)]


def test_age_deletes_every_unprotected_checkpoint_of_old_jobs():
    stored = [ckpt("a", 1, 10), ckpt("a", 2, 10, 100, "latest"), ckpt("b", 1, 1)]
    [(item, reason)] = policy_deletions(stored, None, 5, NOW)
    assert (item.job_id, item.step) == ("a", 1) and "over max_age_days 5" in reason


def test_bytes_delete_the_oldest_jobs_lowest_steps_first_until_within():
    stored = [ckpt("new", 1, 1), ckpt("old", 2, 9), ckpt("old", 1, 9), ckpt("mid", 1, 5)]
    assert chosen(stored, 250, None, NOW) == [("old", 1), ("old", 2)]


def test_protected_bytes_count_but_are_never_chosen():
    stored = [ckpt("a", 1, 9, 1000, "latest"), ckpt("a", 0, 9, 10, "best val_loss #1 of 1")]
    stored.append(ckpt("b", 1, 1, 10))
    assert chosen(stored, 100, None, NOW) == [("b", 1)]  # still over: only LATEST/best left


def test_age_and_bytes_together_count_a_checkpoint_once():
    stored = [ckpt("a", 1, 10), ckpt("b", 1, 2), ckpt("c", 1, 1)]
    assert chosen(stored, 100, 5, NOW) == [("a", 1), ("b", 1)]


def test_within_bounds_nothing_is_chosen():
    assert chosen([ckpt("a", 1, 1)], 100, 5, NOW) == []
