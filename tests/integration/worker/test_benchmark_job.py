"""A benchmark recipe through the service: POST /v1/jobs, a real worker runs the trainer on
2 CPU ranks, and the database ends with every step's metrics and the `benchmark_summary`
event, whose throughput is the measured (post-warm-up) steps' as stored."""

from __future__ import annotations

import statistics

import pytest
from worker_harness import events_of, run_through_service, train_metrics

pytestmark = pytest.mark.slow

WARMUP, MEASURED = 2, 3


def _benchmark_body(assets) -> dict:
    recipe = {
        "recipe": "llm_benchmark",
        "benchmark": {"warmup_steps": WARMUP, "measured_steps": MEASURED},
        "step_scheduler": {"global_batch_size": 4, "local_batch_size": 2},
        "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "distributed": {"strategy": "ddp"},
        "dataset": {"_target_": "tuneyard.datasets.MockDataset", "vocab_size": 512,
                    "seq_length": 32},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
    }  # fmt: skip
    resources = {"nnodes": 1, "nproc_per_node": 2, "accelerator": "cpu"}
    return {"name": "bench", "recipe": recipe, "resources": resources}


def test_benchmark_job_stores_step_metrics_and_its_summary(ty_env, procs, tiny_assets):
    def derived_steps(created: dict) -> None:
        assert created["recipe"]["step_scheduler"]["max_steps"] == WARMUP + MEASURED

    body = _benchmark_body(tiny_assets)
    job_id, _ = run_through_service(procs, body, 150, "benchmark job to finish", derived_steps)
    metrics = train_metrics(job_id)
    assert [m.step for m in metrics] == list(range(1, WARMUP + MEASURED + 1))
    assert all(m.tps > 0 and m.mfu is None for m in metrics)  # CPU: no known peak
    summaries = [e.data for e in events_of(job_id) if e.message.startswith("benchmark_summary")]
    assert len(summaries) == 1
    summary, measured = summaries[0], [m for m in metrics if m.step > WARMUP]
    assert summary["measured_steps"] == MEASURED
    assert summary["tokens_per_s"]["median"] == pytest.approx(
        statistics.median(m.tps for m in measured)
    )
    assert summary["tflops_per_rank"]["median"] > 0 and summary["mfu"] is None
