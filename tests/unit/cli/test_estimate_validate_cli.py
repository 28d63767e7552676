"""`tuneyard validate --accelerator cuda --device-memory 80GiB`: the estimate in the report,
the fit verdict, and the refusal (exit 2, at `distributed`, with fixes) of a recipe that
cannot fit the declared device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.demo_assets import write_squad_dir

REPO = Path(__file__).resolve().parents[3]
CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 512,
          "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
          "num_key_value_heads": 4}  # fmt: skip


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    squad = write_squad_dir(tmp_path / "squad", n=8)
    recipe = yaml.safe_load((REPO / "examples/llm_finetune/tiny_llama_squad.yaml").read_text())
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    for section in ("dataset", "validation_dataset"):
        recipe[section]["path_or_dataset"] = str(squad)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNEYARD_DATA_ROOTS": str(tmp_path),
           "TUNEYARD_CHECKPOINT_ROOTS": str(tmp_path), "TUNEYARD_HOME": str(tmp_path / "home"),
           "HF_HUB_CACHE": str(tmp_path / "hf")}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "cli.main", "validate", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_job_that_fits_80gib_is_valid_and_the_report_shows_the_estimate(recipe_file, tmp_path):
    done = run_cli(tmp_path, str(recipe_file), "--accelerator", "cuda", "--device-memory", "80GiB")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "memory per rank" in done.stdout and "80.00 GiB: fits" in done.stdout
    as_json = run_cli(tmp_path, str(recipe_file), "--accelerator", "cuda",
                      "--device-memory", "80GiB", "--json")  # fmt: skip
    estimate = json.loads(as_json.stdout)["plan"]["estimate"]
    assert estimate["fit"] == {"device_memory_bytes": 80 << 30, "usable_bytes": int(72 * 2**30),
                               "margin": 0.1, "fits": True, "fixes": []}  # fmt: skip
    assert estimate["basis"]["inputs"]["accelerator"] == "cuda"


def test_a_job_that_cannot_fit_is_refused_with_fixes(recipe_file, tmp_path):
    done = run_cli(tmp_path, str(recipe_file), "--accelerator", "cuda", "--device-memory",
                   "256MiB", "--json")  # fmt: skip
    assert done.returncode == 2
    errors = json.loads(done.stdout)["errors"]
    assert [e["loc"] for e in errors] == ["distributed"]
    assert "the device has 256 MiB" in errors[0]["msg"]
    assert errors[0]["fix"].startswith("cheapest first: 1) ")


def test_an_unreadable_size_exits_2(recipe_file, tmp_path):
    done = run_cli(tmp_path, str(recipe_file), "--device-memory", "a lot")
    assert done.returncode == 2 and "--device-memory" in done.stderr
