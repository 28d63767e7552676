"""Step rows in the database: `samples.jsonl` lines upsert per (job, step) fenced by
attempt, previews are stored once per row, and a step reads back with its previews."""

from __future__ import annotations

from jobs.store import queries as store
from jobs.store.samples import ingest_samples, step_samples


def _job(session, project) -> str:
    job, _ = store.create_job(session, project.id, store.NewJob(
        name="j", spec={}, recipe={}, plan={}, resources={}, queue="cpu"))  # fmt: skip
    return job.id


def step_line(step: int, indices: list[int], epoch: int = 0) -> dict:
    rows = [{"index": i, "dp_rank": n % 2, "micro_batch": n // 2} for n, i in enumerate(indices)]
    return {"kind": "step", "step": step, "epoch": epoch, "rows": rows}


def row_line(index: int, text: str) -> dict:
    return {"kind": "row", "index": index, "id": f"row-{index}", "tokens": 7, "preview": text}


def indices(session, job_id: str, step: int) -> list[int]:
    return [r["index"] for r in step_samples(session, job_id, step)["data"]]


def test_a_step_reads_back_its_rows_in_order_with_previews(session, project) -> None:
    job_id = _job(session, project)
    lines = [row_line(5, "five"), row_line(2, "two"), step_line(1, [5, 2]), {"kind": "junk"}]
    assert ingest_samples(session, job_id, 1, lines) == 1
    session.commit()
    found = step_samples(session, job_id, 1)
    assert (found["step"], found["epoch"], found["attempt"]) == (1, 0, 1)
    assert found["data"] == [
        {"index": 5, "id": "row-5", "dp_rank": 0, "micro_batch": 0, "tokens": 7, "preview": "five"},
        {"index": 2, "id": "row-2", "dp_rank": 1, "micro_batch": 0, "tokens": 7, "preview": "two"},
    ]
    assert step_samples(session, job_id, 2) is None


def test_a_later_attempt_replaces_rows_and_an_older_replay_does_not(session, project) -> None:
    job_id = _job(session, project)
    ingest_samples(session, job_id, 1, [step_line(3, [1, 2]), step_line(4, [3, 4])])
    ingest_samples(session, job_id, 2, [step_line(4, [7, 8])])  # the resumed run's step 4
    ingest_samples(session, job_id, 1, [step_line(4, [3, 4])])  # attempt 1's file re-read
    session.commit()
    assert indices(session, job_id, 3) == [1, 2]
    assert indices(session, job_id, 4) == [7, 8]
    assert step_samples(session, job_id, 4)["attempt"] == 2


def test_a_line_keeps_the_attempt_that_wrote_it_never_a_later_one(session, project) -> None:
    job_id = _job(session, project)
    late = {**step_line(8, [1, 2]), "attempt": 1}  # attempt 1's trainer, ingested by attempt 2
    ingest_samples(session, job_id, 2, [step_line(9, [5]), late, {**step_line(10, [6]),
                                                                  "attempt": 7}])  # fmt: skip
    ingest_samples(session, job_id, 2, [step_line(8, [3, 4])])  # attempt 2 re-runs step 8
    ingest_samples(session, job_id, 2, [late])  # and the late line again: it loses
    session.commit()
    assert step_samples(session, job_id, 8)["attempt"] == 2 and indices(session, job_id, 8) == [
        3,
        4,
    ]
    assert step_samples(session, job_id, 10)["attempt"] == 2  # never above the ingesting one


def test_within_an_attempt_the_last_line_wins_and_replays_change_nothing(session, project):
    job_id = _job(session, project)
    lines = [step_line(6, [1, 2]), step_line(6, [9, 10]), row_line(9, "nine")]  # a rollback
    ingest_samples(session, job_id, 1, lines)
    ingest_samples(session, job_id, 1, lines)  # the worker re-reads after a restart
    ingest_samples(session, job_id, 1, [row_line(9, "another text")])  # previews: first kept
    session.commit()
    assert indices(session, job_id, 6) == [9, 10]
    assert step_samples(session, job_id, 6)["data"][0]["preview"] == "nine"
