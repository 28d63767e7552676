"""`JobPublic.run_dir` names the job's run directory relative to the runs directory, never
the server's own path (`api.routes.jobs.job_public`)."""

from __future__ import annotations

from jobs.orchestration.claims import claim_job


def test_run_dir_is_relative_to_the_runs_directory(client, stack, body) -> None:
    job_id = client.post("/v1/jobs", json=body, headers=stack.headers()).json()["id"]
    runs = stack.settings.resolved_runs_dir
    with stack.session() as session:  # what a worker's claim stores
        assert claim_job(session, job_id, "worker-1", 60.0, str(runs / job_id)) is not None
        session.commit()
    read = stack.headers("read")
    one = client.get(f"/v1/jobs/{job_id}", headers=read)
    listed = client.get("/v1/jobs", headers=read).json()["data"]
    assert one.json()["run_dir"] == job_id
    assert [j["run_dir"] for j in listed if j["id"] == job_id] == [job_id]
    assert str(runs) not in one.text and str(stack.settings.home) not in one.text
