"""The submit path: the key looked up on every request, the job and its event committed in
one transaction, the id enqueued after the commit, and a broker client that concurrent
first submits cannot break."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import redis
from sqlalchemy import event, select

from jobs.store.engine import get_engine
from jobs.store.tables import Job, JobEvent, Project

REPO = Path(__file__).resolve().parents[3]
OWN_BROKER = "redis://127.0.0.1:6379/7"


def test_submit_commits_the_job_and_its_event_then_enqueues(client, stack, body, monkeypatch):
    """The key is looked up, the job (with its dispatch mark) and its `submitted` event are
    inserted and committed together, and only then is the id sent to the broker."""
    from jobs import broker

    engine = get_engine(stack.settings)
    order: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        words = statement.split()
        if words[0] in {"INSERT", "UPDATE"}:
            order.append(" ".join(words[:3]))

    def committed(conn) -> None:
        order.append("COMMIT")

    sent = broker.enqueue_job
    monkeypatch.setattr(
        broker, "enqueue_job", lambda *a, **k: order.append("enqueue") or sent(*a, **k)
    )
    event.listen(engine, "before_cursor_execute", record)
    event.listen(engine, "commit", committed)
    try:
        answer = client.post("/v1/jobs", json=body, headers=stack.headers())
    finally:
        event.remove(engine, "before_cursor_execute", record)
        event.remove(engine, "commit", committed)
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["dispatched_at"] is not None
    start = order.index("INSERT INTO jobs")
    assert order[start:] == [
        "INSERT INTO jobs",
        "INSERT INTO job_events",
        "COMMIT",
        "enqueue",
    ], order
    with stack.session() as session:
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job["id"])).all()
    assert [(e.kind, e.to_status) for e in events] == [("submitted", "queued")]


def test_a_refused_send_answers_201_and_leaves_the_job_queued_for_the_reconciler(
    client, stack, body, monkeypatch
):
    from jobs import broker

    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(broker, "enqueue_job", refuse)
    answer = client.post("/v1/jobs", json=body, headers=stack.headers())
    assert answer.status_code == 201, answer.text
    assert answer.json()["status"] == "queued" and answer.json()["dispatched_at"] is None
    with stack.session() as session:
        stored = session.get(Job, answer.json()["id"])
        assert stored.status == "queued" and stored.dispatched_at is None


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
    """Every submit validates against the files as they are now: once its dataset is gone
    the same body is refused, and nothing is stored."""
    import copy
    import shutil
    import uuid

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


def test_a_key_revoked_since_its_last_submit_hears_401_and_nothing_is_stored(client, stack, body):
    """The key is looked up on every request: revoked, its next submit (a valid recipe, an
    invalid one, a replay of its Idempotency-Key) is 401 and writes nothing."""
    key_id, headers = _new_key(stack)
    replay = {**headers, "Idempotency-Key": f"replay-{uuid.uuid4().hex[:8]}"}
    assert client.post("/v1/jobs", json=body, headers=replay).status_code == 201
    _revoke(stack, key_id)
    before = _job_count(stack)
    bad = {**body, "recipe": {**body["recipe"], "step_scheduler": {"max_steps": -1}}}
    for sent, with_headers in ((body, headers), (bad, headers), (body, replay)):
        answer = client.post("/v1/jobs", json=sent, headers=with_headers)
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "unauthorized"
    assert _job_count(stack) == before


def test_a_read_key_cannot_submit(client, stack, body):
    _, headers = _new_key(stack, "read")
    answer = client.post("/v1/jobs", json=body, headers=headers)
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"


def test_a_grant_withdrawn_since_the_last_submit_is_read_on_the_next(client, stack, body):
    """The project's remote-code grant comes with the key on every request: a recipe that
    needs it is accepted while granted and refused, with nothing stored, once withdrawn."""
    from jobs.store.api_keys import set_remote_code

    _, headers = _new_key(stack)
    needs = copy.deepcopy(body)
    needs["recipe"]["model"]["trust_remote_code"] = True
    with stack.session() as session:
        project = session.scalar(select(Project).where(Project.name == stack.project))
        set_remote_code(session, project.id, True)
        session.commit()
    try:
        granted = client.post("/v1/jobs", json=needs, headers=headers)
        assert granted.status_code == 201, granted.text
        with stack.session() as session:
            set_remote_code(session, project.id, False)
            session.commit()
        before = _job_count(stack)
        refused = client.post("/v1/jobs", json=needs, headers=headers)
        assert refused.status_code == 422, refused.text
        assert "model.trust_remote_code" in [e["loc"] for e in refused.json()["errors"]]
        assert _job_count(stack) == before
    finally:
        with stack.session() as session:
            set_remote_code(session, project.id, False)
            session.commit()


def test_the_submit_answer_is_the_job_as_read_back(client, stack, body):
    """The 201 body is the document `GET /v1/jobs/{id}` answers for the same job, value for
    value: one `JobPublic` for both."""
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
