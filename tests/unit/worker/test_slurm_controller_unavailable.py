"""Which sbatch answers mean "the controller is away, ask again" and which refuse the job
itself (SLURM 22-24 messages)."""

from __future__ import annotations

import pytest

from worker.executors.slurm import CONTROLLER_UNAVAILABLE


@pytest.mark.parametrize("said", [
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
    "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
    "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying",
    "sbatch: error: Batch job submission failed: Resource temporarily unavailable",
    "sbatch: error: slurm_receive_msg: Zero Bytes were transmitted or received",
    "sbatch: error: Batch job submission failed: Communication connection failure",
    "sbatch: error: Batch job submission failed: Slurm backup controller in standby mode",
])  # fmt: skip
def test_controller_trouble_is_asked_again(said: str) -> None:
    assert CONTROLLER_UNAVAILABLE.search(said)


@pytest.mark.parametrize("said", [
    "sbatch: error: Batch job submission failed: Invalid partition name specified",
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
    "sbatch: error: Batch job submission failed: Requested node configuration is not available",
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy",
    "sbatch: error: invalid time limit specification",
])  # fmt: skip
def test_a_refusal_of_the_job_is_final(said: str) -> None:
    assert not CONTROLLER_UNAVAILABLE.search(said)
