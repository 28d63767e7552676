"""The launcher: torchrun command lines (standalone, c10d per attempt), environment, recipe file."""

from __future__ import annotations

import os
from pathlib import Path

from worker import proctree
from worker.launcher import (
    CPU_ALLOCATOR_ENV,
    PACKAGES_ROOT,
    LaunchSpec,
    build_command,
    build_env,
    write_recipe,
)


def test_single_node_command_is_standalone(tmp_path: Path):
    spec = LaunchSpec(job_id="j", attempt=2, run_dir=tmp_path, nproc_per_node=2)
    cmd = build_command(spec)
    assert "--standalone" in cmd and "--rdzv-backend" not in cmd
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert cmd[-5:] == ["trainer", "--recipe", str(tmp_path / "recipe.json"), "--run-dir",
                        str(tmp_path)]  # fmt: skip


def test_multi_node_command_uses_c10d_with_a_per_attempt_id(tmp_path: Path):
    spec = LaunchSpec(job_id="j", attempt=3, run_dir=tmp_path, nnodes=2,
                      rdzv_endpoint="10.0.0.1:29400")  # fmt: skip
    cmd = build_command(spec)
    assert "--standalone" not in cmd
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    assert cmd[cmd.index("--rdzv-id") + 1] == "j-3"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert cmd[cmd.index("--nnodes") + 1] == "2"


def test_multi_node_without_endpoint_is_refused(tmp_path: Path):
    import pytest

    with pytest.raises(ValueError, match="rdzv_endpoint"):
        build_command(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, nnodes=2))


def test_env_sets_threads_devices_backend_and_tag(tmp_path: Path):
    cpu = build_env(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, nproc_per_node=2), {})
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["TUNEYARD_DIST_BACKEND"] == "gloo"
    assert int(cpu["OMP_NUM_THREADS"]) >= 1
    assert cpu[proctree.RUN_TAG_ENV] == "j:1:0"
    gpu = build_env(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, accelerator="cuda",
                               gpu_ids=(2, 3), node_rank=1), {"OMP_NUM_THREADS": "4"})  # fmt: skip
    assert gpu["CUDA_VISIBLE_DEVICES"] == "2,3" and gpu["TUNEYARD_DIST_BACKEND"] == "nccl"
    assert gpu["OMP_NUM_THREADS"] == "4" and gpu[proctree.RUN_TAG_ENV] == "j:1:1"


def test_env_keeps_the_run_directory_off_sys_path(tmp_path: Path):
    env = build_env(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path), {"PYTHONPATH": "/x"})
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PACKAGES_ROOT), "/x"]
    assert (PACKAGES_ROOT / "trainer" / "__main__.py").exists()


def test_write_recipe_is_the_stored_json(tmp_path: Path):
    import json

    path = write_recipe(tmp_path / "run", {"step_scheduler": {"max_steps": 3}})
    assert path.name == "recipe.json" and json.loads(path.read_text()) == {
        "step_scheduler": {"max_steps": 3}
    }


def test_cpu_attempts_get_the_allocator_setting_unless_the_operator_chose(tmp_path: Path):
    spec = LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, nproc_per_node=2)
    assert build_env(spec, {}).items() >= CPU_ALLOCATOR_ENV.items()
    own = {key: "65536" for key in CPU_ALLOCATOR_ENV}
    assert build_env(spec, own).items() >= own.items()
    gpu = build_env(LaunchSpec(job_id="j", attempt=1, run_dir=tmp_path, accelerator="cuda"), {})
    assert not set(CPU_ALLOCATOR_ENV) & set(gpu)
