"""A MegatronPretraining recipe through the service: POST /v1/jobs validates it against the
data roots, a real worker runs the trainer on 2 CPU ranks over `.bin`/`.idx` files the test
wrote, and the database ends with every step's metrics."""

from __future__ import annotations

import pytest
from token_corpora import learnable_documents, write_megatron
from worker_harness import run_through_service, train_metrics

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


def test_megatron_job_runs_and_stores_its_metrics(ty_env, procs, tiny_assets):
    job_id, _ = run_through_service(procs, _body(tiny_assets), 150, "megatron job to finish")
    metrics = train_metrics(job_id)
    assert [m.step for m in metrics] == list(range(1, STEPS + 1))
    assert all(m.loss > 0 and m.tps > 0 for m in metrics)
