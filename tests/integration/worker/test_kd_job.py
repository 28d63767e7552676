"""A distillation job through the service: POST /v1/jobs with `recipe: llm_kd` (AutoModel's
KD keys), a worker runs the real trainer with a tiny teacher, and the combined loss of every
step lands in the database, falling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from worker_harness import run_through_service, train_metrics

pytestmark = pytest.mark.slow

STEPS = 30


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cli.demo_assets import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("kd-teacher"), seed=1, num_hidden_layers=4)


def kd_recipe(assets: dict[str, Path], teacher: Path) -> dict[str, Any]:
    dataset = {"_target_": "tuneyard.datasets.JsonlInstructionDataset",
               "path": str(assets["train"]), "max_seq_length": 32}  # fmt: skip
    return {
        "recipe": {"_target_": "nemo_automodel.recipes.llm.kd."
                   "KnowledgeDistillationRecipeForNextTokenPrediction"},
        "step_scheduler": {"max_steps": STEPS, "global_batch_size": 4, "local_batch_size": 4,
                           "log_interval": 1},
        "rng": {"seed": 0},
        "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "teacher_model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
                          "pretrained_model_name_or_path": str(teacher), "dtype": "float32"},
        "kd_loss_fn": {"_target_": "nemo_automodel.components.loss.kd_loss.KDLoss",
                       "temperature": 2.0},
        "kd_ratio": 0.5,
        "dataset": dataset,
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3e-3, "weight_decay": 0.0},
        "checkpoint": {"enabled": False},
    }  # fmt: skip


def test_kd_job_runs_and_stores_the_combined_loss(ty_env, procs, tiny_assets, teacher):
    body = {"name": "kd", "recipe": kd_recipe(tiny_assets, teacher),
            "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}}  # fmt: skip
    job_id, row = run_through_service(procs, body, 180, "KD job")
    assert row.recipe["recipe"] == "llm_kd" and row.recipe["kd_ratio"] == 0.5
    assert row.recipe["teacher_model"]["pretrained_model_name_or_path"] == str(teacher)
    losses = [m.loss for m in train_metrics(job_id)]
    assert len(losses) == STEPS
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
