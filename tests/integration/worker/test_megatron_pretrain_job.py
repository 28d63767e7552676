"""A MegatronPretraining recipe through the service: POST /v1/jobs validates it against the
data roots, a real worker runs the trainer on 2 CPU ranks over `.bin`/`.idx` files the test
wrote, and the database ends with every step's metrics."""

from __future__ import annotations

import pytest
from token_corpora import learnable_documents, write_megatron
from worker_harness import job_row, wait_for

pytestmark = pytest.mark.slow

STEPS = 4


def _body(assets) -> dict:
    prefix = write_megatron(assets["model"].parent / "megatron" / "corpus_text_document",
                            learnable_documents(40, 40, 10, 50))  # fmt: skip
    recipe = {
        "step_scheduler": {"max_steps": STEPS, "global_batch_size": 4, "local_batch_size": 2},
        "model": {"_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "distributed": {"strategy": "ddp"},
        "dataset": {"_target_": "nemo_automodel.components.datasets.llm.megatron_dataset."
                    "MegatronPretraining", "paths": [1, f"{prefix}.bin"], "seq_length": 16,
                    "split": "99,1,0"},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
    }  # fmt: skip
    resources = {"nnodes": 1, "nproc_per_node": 2, "accelerator": "cpu"}
    return {"name": "megatron", "recipe": recipe, "resources": resources}


def _train_steps(job_id: str) -> list:
    from sqlalchemy import select

    from jobs.store.engine import session_factory
    from jobs.store.tables import Metric

    with session_factory()() as session:
        stmt = select(Metric).where(Metric.job_id == job_id, Metric.kind == "train")
        return sorted(session.execute(stmt).scalars(), key=lambda m: m.step)


def _finished(job_id: str):
    row = job_row(job_id)
    return row if row.status in ("succeeded", "failed", "cancelled") else None


def test_megatron_job_runs_and_stores_its_metrics(ty_env, procs, tiny_assets):
    from fastapi.testclient import TestClient

    from api.main import create_app
    from jobs.store.settings import get_settings

    with TestClient(create_app(get_settings())) as client:
        created = client.post("/v1/jobs", json=_body(tiny_assets))
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        procs.worker("w1", trainer=None)
        row = wait_for(lambda: _finished(job_id), 150, "megatron job to finish", procs)
    assert row.status == "succeeded", (row.error_message, procs.logs())
    metrics = _train_steps(job_id)
    assert [m.step for m in metrics] == list(range(1, STEPS + 1))
    assert all(m.loss > 0 and m.tps > 0 for m in metrics)
