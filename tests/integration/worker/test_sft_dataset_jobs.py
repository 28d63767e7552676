"""HellaSwag and ChatDataset jobs through the service: POST /v1/jobs with AutoModel's dataset
blocks, a worker runs the real trainer, and every step's falling loss lands in the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sft_fixtures import TOOL_TEMPLATE, chat_rows, hellaswag_rows, write_jsonl, write_parquet
from worker_harness import run_through_service, train_metrics

pytestmark = pytest.mark.slow

STEPS = 12
LLM = "nemo_automodel.components.datasets.llm"


def _dataset(kind: str, data: Path) -> dict[str, Any]:
    if kind == "hellaswag":
        path = write_parquet(data / "hellaswag.parquet", hellaswag_rows(128))
        return {"_target_": f"{LLM}.hellaswag.HellaSwag", "path_or_dataset": str(path),
                "split": "train"}  # fmt: skip
    path = write_jsonl(data / "chat.jsonl", chat_rows(128))
    return {"_target_": f"{LLM}.chat_dataset.ChatDataset", "path_or_dataset_id": str(path),
            "split": "train", "seq_length": 256, "chat_template": TOOL_TEMPLATE}  # fmt: skip


def _recipe(assets: dict[str, Path], dataset: dict[str, Any]) -> dict[str, Any]:
    return {
        "step_scheduler": {"max_steps": STEPS, "global_batch_size": 8, "local_batch_size": 8,
                           "log_interval": 1},
        "rng": {"seed": 0},
        "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
                  "pretrained_model_name_or_path": str(assets["model"]), "dtype": "float32"},
        "dataset": dataset,
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3e-3, "weight_decay": 0.0},
        "checkpoint": {"enabled": False},
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["hellaswag", "chat"])
def test_an_sft_dataset_job_stores_its_falling_loss(
    ty_env, procs, tiny_assets, kind, tmp_path, monkeypatch
):
    cache = tmp_path / "hf-datasets"  # the worker's trainer inherits it: no write to $HOME
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    dataset = _dataset(kind, tiny_assets["model"].parent / f"sft-{kind}")
    body = {"name": f"sft-{kind}", "recipe": _recipe(tiny_assets, dataset),
            "resources": {"nnodes": 1, "nproc_per_node": 1, "accelerator": "cpu"}}  # fmt: skip
    job_id, row = run_through_service(procs, body, 180, kind)
    assert row.recipe["dataset"]["_target_"] == dataset["_target_"]
    assert list((cache / "tuneyard-tokenized").glob("*.arrow")), "tokenized into the cache"
    losses = [m.loss for m in train_metrics(job_id)]
    assert len(losses) == STEPS
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
