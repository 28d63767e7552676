"""The submit path: one write transaction (job, event and dispatch mark together), the id
enqueued after the commit, and a broker client that concurrent first submits cannot break."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import redis
from sqlalchemy import event

from jobs.store.engine import get_engine

REPO = Path(__file__).resolve().parents[3]
OWN_BROKER = "redis://127.0.0.1:6379/7"


def test_submit_is_one_write_transaction_then_the_enqueue(client, stack, body, redis_db1):
    """On PostgreSQL two round trips in autocommit: the key lookup, then one statement that
    writes the job and its event (atomic on its own: no BEGIN, no COMMIT); on SQLite the
    two inserts in one transaction."""
    statements: list[str] = []
    autocommit: list[bool] = []
    engine = get_engine(stack.settings)

    def record(conn, cursor, statement, *args) -> None:
        statements.append(" ".join(statement.split()[:3]))
        autocommit.append(bool(getattr(conn.connection.dbapi_connection, "autocommit", False)))

    # The first submit fills the queue's capacity cache (two reads kept a few seconds).
    assert client.post("/v1/jobs", json=body, headers=stack.headers()).status_code == 201
    event.listen(engine, "before_cursor_execute", record)
    try:
        answer = client.post("/v1/jobs", json=body, headers=stack.headers())
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["dispatched_at"] is not None
    if engine.dialect.name == "postgresql":
        assert len(statements) == 2 and statements[0].startswith("SELECT"), statements
        assert statements[1] == "WITH new_job AS", statements
        assert autocommit == [True, True]
    else:
        writes = [s for s in statements if s.split()[0] in {"INSERT", "UPDATE", "DELETE"}]
        assert writes == ["INSERT INTO jobs", "INSERT INTO job_events"], statements
    with engine.connect() as conn:
        events = conn.exec_driver_sql(
            "SELECT kind, to_status, message FROM job_events WHERE job_id = ?"
            if engine.dialect.name == "sqlite" else
            "SELECT kind, to_status, message FROM job_events WHERE job_id = %s", (job["id"],)
        ).all()  # fmt: skip
    assert [tuple(e) for e in events] == [("submitted", "queued", "job submitted")]
    queued = [m for m in redis_db1.lrange("cpu", 0, -1) if job["id"].encode() in m]
    assert len(queued) == 1


def test_concurrent_first_enqueues_all_reach_the_broker():
    """32 threads enqueue at once in a process that has not imported celery yet (on a Redis
    database and queue of this test's own: other tests flush DB 1)."""
    queue = f"race-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(OWN_BROKER)
    script = textwrap.dedent("""
        import sys, threading, uuid
        from jobs.broker import enqueue_job
        from jobs.store.settings import Settings
        assert "celery" not in sys.modules
        settings = Settings(broker_url=sys.argv[1])
        barrier, errors = threading.Barrier(32), []
        def send():
            barrier.wait()
            try:
                enqueue_job(str(uuid.uuid4()), sys.argv[2], settings)
            except Exception as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=send) for _ in range(32)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(len(errors), errors[:3])
    """)
    out = subprocess.run([sys.executable, "-c", script, OWN_BROKER, queue], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("0 "), out.stdout
        assert client.llen(queue) == 32
    finally:
        client.delete(queue)
        client.close()


def test_a_resubmitted_recipe_is_checked_against_the_files_again(client, stack, body):
    """The second submit of a recipe is answered from the validation memo; once its
    dataset is gone the same body is refused, and nothing is stored."""
    import copy
    import shutil
    import uuid

    from api import validation_memo

    validation_memo.forget()
    shared = Path(body["recipe"]["dataset"]["path_or_dataset"])
    own = shared.parent / f"squad-{uuid.uuid4().hex[:8]}"  # inside the data root
    shutil.copytree(shared, own)
    body = copy.deepcopy(body)
    body["recipe"]["dataset"]["path_or_dataset"] = str(own)
    first = client.post("/v1/jobs", json=body, headers=stack.headers())
    again = client.post("/v1/jobs", json={**body, "name": "again"}, headers=stack.headers())
    assert first.status_code == again.status_code == 201, again.text
    assert again.json()["plan"] == first.json()["plan"]
    assert again.json()["recipe"] == first.json()["recipe"]
    shutil.rmtree(body["recipe"]["dataset"]["path_or_dataset"])
    listed = client.get("/v1/jobs", headers=stack.headers()).json()["data"]
    refused = client.post("/v1/jobs", json={**body, "name": "gone"}, headers=stack.headers())
    assert refused.status_code == 422, refused.text
    assert "dataset.path_or_dataset" in [e["loc"] for e in refused.json()["errors"]]
    assert client.get("/v1/jobs", headers=stack.headers()).json()["data"] == listed
