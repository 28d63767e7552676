"""The trainer runs the stored typed recipe as validation built it: nothing re-validated or
re-derived. For DDP, FSDP2, TP and EP layouts on 2 gloo ranks, the `started` event's
max_steps, mesh and gradient accumulation equal the plan's, and no rank imported the
schema, normalisation or validation code. A max_steps longer than an epoch is honoured."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
from test_expert_parallel_run import build_tiny_qwen3_moe
from trainer_harness import REPO, Assets, RunResult, base_recipe, trainer_command, trainer_env

from jobs.recipe.settings import RecipeSettings
from jobs.recipe.validation import validate_job
from worker.launcher import write_recipe

pytestmark = pytest.mark.slow

# What a rank must never import when it runs a stored recipe: the code that validates.
VALIDATING_MODULES = {
    "jobs.recipe.validation", "jobs.recipe.load.normalize", "jobs.recipe.load.schema",
    "jobs.recipe.paths.data", "jobs.recipe.plan.batches", "jobs.recipe.sections.values", "jobs.recipe.topology.section", "jobs.recipe.model.config",
}  # fmt: skip
SITECUSTOMIZE = """
import atexit, os, sys
def _dump():
    path = os.path.join(os.environ["MODULES_OUT"], f"rank{os.environ.get('RANK', '0')}.txt")
    with open(path, "w") as f:
        f.write("\\n".join(sorted(m for m in sys.modules if m.startswith("jobs"))))
atexit.register(_dump)
"""


def run_stored(assets: Assets, name: str, recipe: dict[str, Any], nproc: int) -> tuple:
    settings = RecipeSettings(data_roots=str(assets.root), checkpoint_roots=str(assets.root))
    result = validate_job(recipe, resources={"nproc_per_node": nproc}, settings=settings)
    assert result.valid, result.errors
    run_dir = assets.root / "runs" / f"stored-{name}"
    path = write_recipe(run_dir, result.recipe)
    probe = assets.root / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(SITECUSTOMIZE)
    modules = run_dir / "modules"
    modules.mkdir()
    env = trainer_env(assets)
    env.update(PYTHONPATH=f"{probe}{os.pathsep}{env['PYTHONPATH']}", MODULES_OUT=str(modules))
    done = subprocess.run(trainer_command(path, run_dir, nproc), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    run = RunResult(run_dir, done.returncode, done.stdout + done.stderr)
    imported = set().union(*(set(p.read_text().split()) for p in modules.glob("rank*.txt")))
    return result.plan, run, imported


def layouts(assets: Assets) -> dict[str, dict[str, Any]]:
    moe = str(build_tiny_qwen3_moe(assets.root / "stored-moe"))
    return {
        "ddp": {"distributed": {"strategy": "ddp"}},
        "fsdp2": {"distributed": {"strategy": "fsdp2", "activation_checkpointing": True}},
        "tp": {"distributed": {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True}},
        "ep": {"distributed": {"strategy": "fsdp2", "ep_size": 2}, "model_path": moe},
    }


@pytest.mark.parametrize("layout", ["ddp", "fsdp2", "tp", "ep"])
def test_the_started_event_is_the_plan_and_nothing_validates_again(assets, layout):
    spec = layouts(assets)[layout]
    recipe = base_recipe(assets, distributed=spec["distributed"],
                         step_scheduler={"max_steps": 4, "val_check_interval": None,
                                         "checkpoint_interval": None},
                         checkpoint={"enabled": False})  # fmt: skip
    if "model_path" in spec:
        recipe["model"]["pretrained_model_name_or_path"] = spec["model_path"]
    plan, run, imported = run_stored(assets, layout, recipe, nproc=2)
    assert run.returncode == 0, run.output[-3000:]
    [started] = [e for e in run.events() if e["event"] == "started"]
    assert started["max_steps"] == plan["max_steps"] == 4
    assert started["grad_accumulation_steps"] == plan["grad_accumulation_steps"]
    assert started["world_size"] == plan["world_size"] == 2
    built, planned = started["mesh_shape"], plan["mesh_shape"]
    assert (built["dp_shard"], built["tp"]) == (plan["dp_shard_size"], plan["tp_size"])
    assert all(built.get(axis, 1) == size for axis, size in planned.items() if axis != "dp")
    assert started["ep_size"] == plan["ep_size"] and started["dp_size"] == plan["dp_size"]
    assert [r["step"] for r in run.records()] == [1, 2, 3, 4]
    assert imported and "jobs.recipe.typed" in imported
    assert not imported & VALIDATING_MODULES, sorted(imported & VALIDATING_MODULES)


def test_max_steps_runs_past_the_end_of_an_epoch(assets):
    """16 samples in batches of 4 make 2 steps per epoch (grad accumulation 2): 7 steps run."""
    from cli.demo_assets import write_instruction_jsonl

    small = write_instruction_jsonl(assets.root / "data" / "small.jsonl", 16, seed=3)
    recipe = base_recipe(assets, step_scheduler={"max_steps": 7, "num_epochs": None,
                                                 "val_check_interval": None},
                         checkpoint={"enabled": False})  # fmt: skip
    recipe["dataset"]["path"] = str(small)
    plan, run, _ = run_stored(assets, "epochs", recipe, nproc=1)
    assert run.returncode == 0, run.output[-3000:]
    records = run.records()
    assert plan["max_steps"] == 7 and [r["step"] for r in records] == list(range(1, 8))
    assert max(r["epoch"] for r in records) == 3
    [started] = [e for e in run.events() if e["event"] == "started"]
    assert started["max_steps"] == 7
