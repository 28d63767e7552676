"""GPU slices of one worker: disjoint per job, waiting when full, freed at the end."""

from __future__ import annotations

import threading
import time

from worker.gpu_slices import GpuSlices


def test_jobs_get_disjoint_slices_lowest_ids_first():
    slices = GpuSlices((0, 1, 2, 3))
    assert slices.acquire("a", 2, 0) == (0, 1)
    assert slices.acquire("b", 1, 0) == (2,)
    assert slices.free() == (3,)
    slices.release("a")
    assert slices.acquire("c", 3, 0) == (0, 1, 3)


def test_a_job_that_does_not_fit_waits_then_gives_up():
    slices = GpuSlices((0, 1))
    slices.acquire("a", 2, 0)
    started = time.monotonic()
    assert slices.acquire("b", 1, 0.1) is None
    assert time.monotonic() - started >= 0.1


def test_a_waiting_job_takes_the_slice_as_soon_as_it_frees():
    slices, got = GpuSlices((0, 1)), []
    slices.acquire("a", 2, 0)
    waiter = threading.Thread(target=lambda: got.append(slices.acquire("b", 2, 5)))
    waiter.start()
    time.sleep(0.05)
    slices.release("a")
    waiter.join(2)
    assert got == [(0, 1)]


def test_a_duplicate_message_shares_the_slice_and_does_not_free_it():
    slices = GpuSlices((0, 1, 2, 3))
    assert slices.acquire("a", 2, 0) == slices.acquire("a", 2, 0) == (0, 1)
    slices.release("a")  # the duplicate ends: the running attempt keeps its GPUs
    assert slices.held() == {"a": [0, 1]}
    with slices.holding("a"):
        pass
    assert slices.held() == {}


def test_cpu_jobs_and_workers_without_gpus_use_no_slice():
    assert GpuSlices(()).acquire("a", 4, 0) == ()
    assert GpuSlices((0,)).acquire("a", 0, 0) == ()
    assert GpuSlices((0, 1)).acquire("big", 8, 0) == (0, 1)  # more than it has: all of them
