"""Fixtures for recipe validation tests: local roots, a config-only model dir, SQuAD data.

`validate` runs `validate_job` against settings whose data and checkpoint roots are under
`tmp_path`, so path rules are tested without touching the working tree; the Hugging Face
cache points at an empty temp dir so a hub name never finds a real cached config.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from recipe_asserts import write_model_dir

from cli.demo_assets import write_squad_dir
from jobs.recipe.settings import RecipeSettings as Settings
from jobs.recipe.validation import ValidationResult, validate_job


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


@pytest.fixture
def ckpt_root(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    root.mkdir()
    return root


@pytest.fixture
def settings(tmp_path: Path, data_root: Path, ckpt_root: Path) -> Settings:
    return Settings(
        home=tmp_path / "home",
        data_roots=str(data_root),
        checkpoint_roots=str(ckpt_root),
        runs_dir=ckpt_root / "runs",
    )


@pytest.fixture
def model_dir(data_root: Path) -> Path:
    return write_model_dir(data_root / "tiny_llama")


@pytest.fixture
def squad_dir(data_root: Path) -> Path:
    return write_squad_dir(data_root / "squad", n=8)


@pytest.fixture
def recipe(model_dir: Path, squad_dir: Path) -> dict[str, Any]:
    """A valid recipe on local assets (one process: dp 1)."""
    return {
        "step_scheduler": {"max_steps": 20, "global_batch_size": 8, "val_check_interval": 10},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model_dir),
            "dtype": "float32",
        },
        "distributed": {"strategy": "fsdp2", "dp_size": "auto"},
        "dataset": {
            "_target_": "tuneyard.datasets.SquadDataset",
            "path_or_dataset": str(squad_dir),
            "max_seq_length": 64,
        },
        "dataloader": {"batch_size": 4},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
        "lr_scheduler": {
            "_target_": "tuneyard.schedulers.CosineAnnealingWarmup",
            "warmup_steps": 2,
            "min_lr": 1e-4,
        },
    }


Validate = Callable[..., ValidationResult]


@pytest.fixture
def validate(settings: Settings) -> Validate:
    """validate_job with the test roots; resources as keyword arguments."""

    def run(recipe: Any, overrides: Any = (), **resources: Any) -> ValidationResult:
        return validate_job(recipe, overrides, resources or None, settings)

    return run
