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
    """With a key the process verified before, on PostgreSQL one round trip in autocommit:
    the statement that checks the key and writes the job and its event (atomic on its own:
    no BEGIN, no COMMIT); on SQLite the key check and the two inserts in one transaction."""
    statements: list[str] = []
    autocommit: list[bool] = []
    engine = get_engine(stack.settings)

    def record(conn, cursor, statement, *args) -> None:
        statements.append(" ".join(statement.split()[:3]))
        autocommit.append(bool(getattr(conn.connection.dbapi_connection, "autocommit", False)))

    # The first submit fills the queue's capacity cache (two reads kept a few seconds) and
    # keeps the key's principal.
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
        assert statements == ["WITH live_key AS"]
        assert autocommit == [True]
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


def _statements(engine, submit) -> tuple[list[str], object]:
    """The first words of each statement `submit()` sent, and its answer."""
    sent: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        sent.append(" ".join(statement.split()[:2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        answer = submit()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return [s for s in sent if s.split()[0] in {"SELECT", "WITH", "INSERT"}], answer


def _new_key(stack, role: str = "submit"):
    from jobs.store.api_keys import create_api_key

    with stack.session() as session:
        key, raw = create_api_key(session, stack.project, role)
        session.commit()
        return key.id, {"Authorization": f"Bearer {raw}"}


def _revoke(stack, key_id: int) -> None:
    from jobs.store.api_keys import revoke_api_key

    with stack.session() as session:
        assert revoke_api_key(session, key_id)
        session.commit()


def _job_count(stack) -> int:
    from sqlalchemy import func, select

    from jobs.store.tables import Job

    with stack.session() as session:
        return session.scalar(select(func.count()).select_from(Job))


def test_a_kept_key_revoked_since_is_refused_by_the_insert(client, stack, body):
    """The key's principal is kept after its first submit; once the key is revoked the
    next submit's guarded insert writes nothing, the key is asked again, and it hears 401."""
    key_id, headers = _new_key(stack)
    assert client.post("/v1/jobs", json=body, headers=headers).status_code == 201
    _revoke(stack, key_id)
    before = _job_count(stack)
    sent, answer = _statements(get_engine(stack.settings),
                               lambda: client.post("/v1/jobs", json=body, headers=headers))  # fmt: skip
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthorized"
    assert _job_count(stack) == before
    if stack.backend == "postgresql":  # the guarded insert, then the lookup that finds it revoked
        assert [s.split()[0] for s in sent] == ["WITH", "SELECT"], sent
    again = client.post("/v1/jobs", json=body, headers=headers)  # no longer kept: looked up
    assert again.status_code == 401


def test_a_kept_key_revoked_since_hears_401_not_its_recipes_errors(client, stack, body):
    key_id, headers = _new_key(stack)
    assert client.post("/v1/jobs", json=body, headers=headers).status_code == 201
    _revoke(stack, key_id)
    bad = {**body, "recipe": {**body["recipe"], "step_scheduler": {"max_steps": -1}}}
    answer = client.post("/v1/jobs", json=bad, headers=headers)
    assert answer.status_code == 401, answer.text


def test_an_invalid_recipe_on_a_kept_key_is_422_after_one_lookup(client, stack, body):
    _, headers = _new_key(stack)
    assert client.post("/v1/jobs", json=body, headers=headers).status_code == 201
    bad = {**body, "recipe": {**body["recipe"], "step_scheduler": {"max_steps": -1}}}
    sent, answer = _statements(get_engine(stack.settings),
                               lambda: client.post("/v1/jobs", json=bad, headers=headers))  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert "step_scheduler.max_steps" in [e["loc"] for e in answer.json()["errors"]]
    if stack.backend == "postgresql":
        assert sent == ["SELECT api_keys.project_id,"], sent  # the key asked once, nothing written


def test_a_replay_asks_for_the_key_first(client, stack, body):
    """An Idempotency-Key may answer a stored job without writing: its key is looked up."""
    key_id, headers = _new_key(stack)
    headers = {**headers, "Idempotency-Key": f"replay-{uuid.uuid4().hex[:8]}"}
    first = client.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 201
    _revoke(stack, key_id)
    assert client.post("/v1/jobs", json=body, headers=headers).status_code == 401


def test_a_read_key_is_never_kept_for_submits(client, stack, body):
    _, headers = _new_key(stack, "read")
    for _ in range(2):
        answer = client.post("/v1/jobs", json=body, headers=headers)
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"


def test_a_guard_that_refuses_twice_is_401_and_the_key_is_not_kept(client, stack, body,
                                                                   monkeypatch):  # fmt: skip
    """Refused again after the key was asked afresh (its grant changed twice in between):
    401, nothing stored, and the next submit looks the key up."""
    from jobs.store import queries

    _, headers = _new_key(stack)
    assert client.post("/v1/jobs", json=body, headers=headers).status_code == 201
    before = _job_count(stack)

    def refuse(*args, **kwargs):
        raise queries.KeyRefused("refused")

    monkeypatch.setattr(queries, "create_job", refuse)
    answer = client.post("/v1/jobs", json=body, headers=headers)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"
    monkeypatch.undo()
    assert _job_count(stack) == before
    sent, again = _statements(get_engine(stack.settings),
                              lambda: client.post("/v1/jobs", json=body, headers=headers))  # fmt: skip
    assert again.status_code == 201
    if stack.backend == "postgresql":
        assert [s.split()[0] for s in sent] == ["SELECT", "WITH"], sent


def test_the_submit_answer_is_the_job_as_read_back(client, stack, body):
    """The 201 body (written from the values just stored, without a model) is the document
    `GET /v1/jobs/{id}` answers for the same job (through `JobPublic`), value for value,
    and the written job carries every column as the database holds it."""
    labelled = {**body, "labels": {"team": "nlp", "owner": "ünïcode ✓"}, "priority": 3,
                "max_attempts": 5, "overrides": ["optimizer.lr=0.00001"]}  # fmt: skip
    answer = client.post("/v1/jobs", json=labelled,
                         headers={**stack.headers(), "Idempotency-Key": uuid.uuid4().hex})  # fmt: skip
    assert answer.status_code == 201, answer.text
    assert answer.headers["content-type"] == "application/json"
    read = client.get(f"/v1/jobs/{answer.json()['id']}", headers=stack.headers())
    assert read.status_code == 200, read.text
    assert answer.json() == read.json()
    assert answer.json()["recipe"]["optimizer"]["lr"] == 1e-5
