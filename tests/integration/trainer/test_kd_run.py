"""A distillation recipe (`recipe: llm_kd`) on 2 gloo ranks: a tiny Llama student learns from
a deeper tiny Llama teacher with the same tokenizer, the teacher sharded with FSDP2 like the
student (and replicated under DDP); the logged loss is the CE/KD mix and it falls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import Assets, base_recipe, launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def teacher(assets: Assets) -> Path:
    from cli.demo_assets import build_tiny_llama

    return build_tiny_llama(assets.root / "tiny-teacher", seed=1, num_hidden_layers=4)


def kd_recipe(assets: Assets, teacher: Path, strategy: str, max_steps: int) -> dict[str, Any]:
    return base_recipe(
        assets,
        recipe="KnowledgeDistillationRecipeForNextTokenPrediction",
        step_scheduler={
            "max_steps": max_steps,
            "val_check_interval": max_steps,
            "checkpoint_interval": max_steps,
        },  # fmt: skip
        distributed={"strategy": strategy},
        teacher_model={
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(teacher),
            "dtype": "float32",
        },
        kd_loss_fn={
            "_target_": "nemo_automodel.components.loss.kd_loss.KDLoss",
            "ignore_index": -100,
            "temperature": 2.0,
            "fp32_upcast": True,
        },
        kd_ratio=0.5,
    )


@pytest.fixture(scope="module")
def fsdp2_run(assets: Assets, teacher: Path):
    result = launch(assets, "kd-fsdp2", kd_recipe(assets, teacher, "fsdp2", 24), nproc=2)
    assert result.returncode == 0, result.output
    return result


def test_combined_loss_falls(fsdp2_run) -> None:
    losses = [r["loss"] for r in fsdp2_run.records()]
    assert len(losses) == 24
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4, losses


def test_validation_measures_the_student(fsdp2_run) -> None:
    (val,) = fsdp2_run.records("val")
    assert val["val_loss"] > 0


def test_checkpoint_holds_the_student_not_the_teacher(fsdp2_run) -> None:
    config = json.loads((fsdp2_run.latest() / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2


def test_ddp_replicates_the_frozen_teacher(assets: Assets, teacher: Path) -> None:
    result = launch(assets, "kd-ddp", kd_recipe(assets, teacher, "ddp", 4), nproc=2)
    assert result.returncode == 0, result.output
    assert [r["step"] for r in result.records()] == [1, 2, 3, 4]
