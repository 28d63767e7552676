"""A failure keeps its reason whichever rank saw it: 2 gloo ranks of the real trainer under a
real worker (PostgreSQL, Redis, torchrun), one rank hitting a data error (`rank_fault_trainer`)
at step 2, while its peer waits in the step's collectives and then crashes on the closed
connection, or during set-up, when torchrun may stop the peer before it writes anything. The
job ends `failed` with the data error, naming the rank that saw it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rank_fault_trainer import FAULT_FIX, FAULT_MESSAGE, FAULT_RANK_ENV, FAULT_STEP_ENV
from worker_harness import SETTLED, events_of, insert_job, job_row, wait_for

from worker import proctree

pytestmark = pytest.mark.slow
RANK_FAULT_TRAINER = "tests.integration.worker.rank_fault_trainer"
EXPECTED_FIX = f"(fix: {FAULT_FIX})"


def two_rank_recipe(assets: dict[str, Path], max_steps: int = 6) -> dict[str, Any]:
    """The tiny Llama on 2 CPU ranks of one node, normalized by validation."""
    from jobs.recipe.validation import validate_job

    def dataset(path: Path) -> dict[str, Any]:
        return {"_target_": "tuneyard.datasets.JsonlInstructionDataset", "path": str(path),
                "tokenizer_name_or_path": str(assets["model"]), "max_seq_length": 32}  # fmt: skip

    recipe = {
        "step_scheduler": {"max_steps": max_steps, "global_batch_size": 8, "local_batch_size": 4,
                           "val_check_interval": max_steps, "checkpoint_interval": max_steps},
        "rng": {"seed": 0},
        "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "distributed": {"strategy": "ddp"},
        "dataset": dataset(assets["train"]),
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
    }  # fmt: skip
    resources = {"nnodes": 1, "nproc_per_node": 2, "accelerator": "cpu"}
    result = validate_job(recipe, resources=resources)
    assert result.valid, result.errors
    return result.recipe


def run_with_fault(project_id: int, procs, assets, rank: int, step: int = 2) -> tuple[str, Any]:
    """One attempt allowed: a crash would fail the job at once instead of retrying."""
    job_id = insert_job(project_id, two_rank_recipe(assets), nproc=2, max_attempts=1)
    fault = {FAULT_RANK_ENV: str(rank), FAULT_STEP_ENV: str(step)}
    procs.worker("w1", trainer=RANK_FAULT_TRAINER, **fault)
    row = wait_for(lambda: (r := job_row(job_id)).status in SETTLED and r, 180,
                   "the job to settle", procs)  # fmt: skip
    assert not proctree.tagged_pids(job_id)
    return job_id, row


def failed_events(job_id: str) -> list[Any]:
    return [e for e in events_of(job_id) if e.kind == "trainer" and e.data.get("event") == "failed"]


@pytest.mark.parametrize("step", [2, 0], ids=["mid-step", "in-setup"])
def test_a_data_error_on_rank_1_alone_is_the_job_error(project_id, procs, tiny_assets, step):
    job_id, row = run_with_fault(project_id, procs, tiny_assets, rank=1, step=step)
    assert (row.status, row.attempt, row.error_code) == ("failed", 1, "data_error"), (
        row.error_message,
        procs.logs(),
    )
    assert row.error_message == f"[rank 1] {FAULT_MESSAGE} {EXPECTED_FIX}"
    shown = failed_events(job_id)[-1]  # rank 0 crashed on the closed connection, if it lived
    assert (shown.data["reported_by"], shown.data["ranks"], shown.data["code"]) == (
        "worker",
        [1],
        "data_error",
    )
    assert shown.message == f"failed at step {max(0, step - 1)}: {row.error_message}"
    assert not any(e.to_status == "retrying" for e in events_of(job_id))


def test_a_data_error_on_rank_0_alone_still_reports_from_rank_0(project_id, procs, tiny_assets):
    job_id, row = run_with_fault(project_id, procs, tiny_assets, rank=0)
    assert (row.status, row.attempt, row.error_code) == ("failed", 1, "data_error"), (
        row.error_message,
        procs.logs(),
    )
    assert row.error_message == f"[rank 0] {FAULT_MESSAGE} {EXPECTED_FIX}"
    [event] = failed_events(job_id)  # the trainer's own: the worker adds none
    assert "reported_by" not in event.data and event.data["fix"] == FAULT_FIX
    assert event.data["message"] == FAULT_MESSAGE and event.data["exit_code"] == 3
