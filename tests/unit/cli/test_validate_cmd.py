"""`tuneyard validate` (issue 2, section 9): exit codes, the JSON shape, the readable report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from cli import validate_cmd
from cli.demo_assets import write_squad_dir

REPO = Path(__file__).resolve().parents[3]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


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


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TUNEYARD_DATA_ROOTS": str(tmp_path),
        "TUNEYARD_CHECKPOINT_ROOTS": str(tmp_path),
        "TUNEYARD_HOME": str(tmp_path / "home"),
        "HF_HUB_CACHE": str(tmp_path / "hf"),
    }


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "validate", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_valid_recipe_exits_0_with_one_json_object(recipe_file, env):
    done = run_cli(env, str(recipe_file), "--nproc-per-node", "2", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)  # exactly one JSON document
    assert set(payload) == {"valid", "errors", "warnings", "plan"}
    assert payload["valid"] is True and payload["errors"] == []
    assert (
        payload["plan"]["world_size"] == 2 and payload["plan"]["architecture"] == "LlamaForCausalLM"
    )
    assert "torch" not in done.stderr


def test_invalid_recipe_exits_2_with_located_errors(recipe_file, env):
    done = run_cli(
        env,
        str(recipe_file),
        "--json",
        "--nnodes",
        "2",
        "--optimizer.lrr",
        "1e-4",
        "--distributed.tp_size=3",
        "--accelerator",
        "cpu",
    )
    assert done.returncode == 2
    payload = json.loads(done.stdout)
    assert payload["valid"] is False
    assert {e["loc"] for e in payload["errors"]} == {"optimizer.lrr", "distributed.tp_size"}
    assert all(set(e) == {"loc", "msg", "fix"} for e in payload["errors"])


def test_readable_report_lists_every_error(recipe_file, env):
    done = run_cli(env, str(recipe_file), "--step_scheduler.max_step", "5", "--optimizer.lrr=1")
    assert done.returncode == 2
    assert "step_scheduler.max_step" in done.stdout and "optimizer.lrr" in done.stdout
    assert "fix: did you mean 'max_steps'?" in done.stdout and "plan:" in done.stdout


def in_process(*args: str):
    app = typer.Typer()
    validate_cmd.register(app)
    app.command("noop")(lambda: None)  # keep 'validate' a subcommand, as in cli.main
    return CliRunner().invoke(app, ["validate", *args])


def test_overrides_and_bare_flags_reach_the_validator(recipe_file, env, monkeypatch):
    for key in ("TUNEYARD_DATA_ROOTS", "TUNEYARD_CHECKPOINT_ROOTS", "HF_HUB_CACHE"):
        monkeypatch.setenv(key, env[key])
    from jobs.store.settings import get_settings

    get_settings.cache_clear()
    try:
        result = in_process(
            str(recipe_file),
            "--nproc-per-node",
            "2",
            "--json",
            "--distributed.tp_size",
            "2",
            "--distributed.sequence_parallel",
        )
    finally:
        get_settings.cache_clear()
    payload = json.loads(result.output)
    assert result.exit_code == 0, payload
    assert payload["plan"]["mesh_shape"]["tp"] == 2


def test_bad_accelerator_is_a_located_error(recipe_file):
    result = in_process(str(recipe_file), "--accelerator", "tpu", "--json")
    assert result.exit_code == 2
    assert "resources.accelerator" in [e["loc"] for e in json.loads(result.output)["errors"]]


def test_missing_recipe_file(tmp_path):
    result = in_process(str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2 and "<recipe>" in result.output


def _with_side_sections(recipe_file: Path) -> Path:
    recipe = yaml.safe_load(recipe_file.read_text())
    recipe["ci"] = {"time": "00:30:00"}
    recipe["nvtx"] = {"enabled": True}
    recipe_file.write_text(yaml.safe_dump(recipe))
    return recipe_file


def test_warnings_are_in_the_json_and_keep_the_recipe_valid(recipe_file, env):
    done = run_cli(env, str(_with_side_sections(recipe_file)), "--json")
    assert done.returncode == 0, done.stdout
    payload = json.loads(done.stdout)
    assert [w["loc"] for w in payload["warnings"]] == ["ci", "nvtx"]
    assert "NVTX profiling ranges" in payload["warnings"][1]["msg"]


def test_warnings_are_printed_in_the_report(recipe_file, env):
    done = run_cli(env, str(_with_side_sections(recipe_file)))
    assert done.returncode == 0, done.stdout
    assert "warning: ci: accepted and ignored: AutoModel CI metadata" in done.stdout


def test_a_package_this_interpreter_lacks_is_a_warning(recipe_file, env):
    recipe = yaml.safe_load(recipe_file.read_text())
    recipe["optimizer"] = {"_target_": "dion.Muon", "lr": 1e-3}
    recipe_file.write_text(yaml.safe_dump(recipe))
    done = run_cli(env, str(recipe_file), "--json")
    assert done.returncode == 0, done.stdout
    payload = json.loads(done.stdout)
    assert payload["plan"]["requires"] == {"dion": "optimizer._target_"}
    [warning] = [w for w in payload["warnings"] if w["loc"] == "optimizer._target_"]
    assert "needs dion, which this interpreter cannot import" in warning["msg"]
