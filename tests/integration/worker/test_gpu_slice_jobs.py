"""GPU slices through a real worker (-c 3) with a declared 4-GPU inventory and the fake
trainer: concurrent CUDA jobs see disjoint CUDA_VISIBLE_DEVICES, and a job that does not
fit the free GPUs waits (its message goes back to the queue) until a slice frees up."""

from __future__ import annotations

import pytest
from worker_harness import events_of, insert_job, job_row, wait_for

pytestmark = pytest.mark.slow


def _visible(job_id: str) -> set[int] | None:
    for event in events_of(job_id):
        data = event.data or {}
        if event.kind == "trainer" and data.get("event") == "started":
            return {int(x) for x in (data.get("cuda_visible_devices") or "").split(",") if x}
    return None


def _window(job_id: str) -> tuple[float, float]:
    running = [e.created_at for e in events_of(job_id) if e.to_status == "running"]
    ended = [e.created_at for e in events_of(job_id) if e.to_status == "succeeded"]
    return running[0].timestamp(), ended[0].timestamp()


def test_concurrent_cuda_jobs_get_disjoint_slices_and_the_third_waits(project_id, procs):
    fake = {"fake": {"steps": 30, "step_seconds": 0.1}}
    jobs = [insert_job(project_id, fake, nproc=2, accelerator="cuda") for _ in range(3)]
    procs.worker("gpu-w1", concurrency=3, CUDA_VISIBLE_DEVICES="0,1,2,3",
                 TUNEYARD_WORKER_GPU_WAIT_SECONDS="0.5")  # fmt: skip
    for job_id in jobs:
        row = wait_for(lambda j=job_id: job_row(j).status == "succeeded" and job_row(j), 120,
                       f"job {job_id} to succeed", procs)  # fmt: skip
        assert row.status == "succeeded"
    slices = {job_id: _visible(job_id) for job_id in jobs}
    assert all(s is not None and len(s) == 2 and s <= {0, 1, 2, 3} for s in slices.values()), slices
    windows = {job_id: _window(job_id) for job_id in jobs}
    for a in jobs:
        for b in jobs:
            overlap = a < b and windows[a][0] < windows[b][1] and windows[b][0] < windows[a][1]
            if overlap:
                assert not slices[a] & slices[b], (slices, windows)
    # 3 jobs x 2 GPUs on 4 GPUs: at least one pair never overlapped in time
    pairs = [(a, b) for a in jobs for b in jobs if a < b]
    assert any(not (windows[a][0] < windows[b][1] and windows[b][0] < windows[a][1])
               for a, b in pairs), windows  # fmt: skip
