"""Starting a job attempt: the run directory, the `torchrun` command and its environment.

The worker never imports torch; it writes the stored typed recipe to `<run_dir>/recipe.json`
and starts `torchrun ... -m trainer --recipe ... --run-dir ...` as a subprocess in a
session of its own, tagged (see `worker.proctree`) so every rank can be found and stopped,
with a parent-death signal so a killed worker does not leave training running unsupervised.

The trainer runs with the run directory as its working directory, and a run directory holds
what a recipe or a dataset put there. So the launch cannot let it shadow tuneyard's own
packages: `PYTHONSAFEPATH=1` keeps the working directory (and a script's directory) off
`sys.path`, and the directory that holds tuneyard's packages goes first on `PYTHONPATH`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from worker.proctree import RUN_TAG_ENV, run_tag, set_parent_death_signal

RECIPE_FILE = "recipe.json"
# glibc's malloc raises its mmap threshold to the size of every large block a process frees
# (up to 32 MiB); past that, the buffers FSDP2 allocates and frees each step (gathered
# parameters, gradients, gloo's copies) come from per-thread heaps that keep their pages, and
# a 2-rank CPU run of a 60M Llama peaked at 3.5x the model's bytes per rank instead of 1.9x
# (`bench/bench_run_memory.py`). A fixed threshold hands every block above it back to the
# kernel when it is freed; the step-time cost is measured by `bench/bench_cpu_allocator.py`.
# Set only where the operator's environment does not already choose.
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
# The directory that holds the `trainer`, `models` and `jobs` packages beside `worker`.
PACKAGES_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class LaunchSpec:
    job_id: str
    attempt: int
    run_dir: Path
    nnodes: int = 1
    nproc_per_node: int = 1
    accelerator: str = "cpu"
    rdzv_endpoint: str | None = None  # host:port of the c10d store, multi-node only
    gpu_ids: tuple[int, ...] = ()
    rdzv_timeout_s: int = 120
    node_rank: int = 0  # the worker's slot in a gang (torchrun assigns ranks itself)
    trainer_module: str = "trainer"

    @property
    def recipe_path(self) -> Path:
        return self.run_dir / RECIPE_FILE


def write_recipe(run_dir: Path, recipe: dict) -> Path:
    """Write the stored (typed, validated) recipe where the trainer reads it, atomically.

    JSON, as the database holds it: the trainer rebuilds the typed recipe from it exactly.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RECIPE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(recipe, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def torchrun_prefix() -> list[str]:
    """torchrun under this interpreter (so the trainer sees the same packages), through
    `trainer.launch`: a pause or cancel ends the job log with one line, not a traceback."""
    return [sys.executable, "-m", "trainer.launch"]


def build_command(spec: LaunchSpec) -> list[str]:
    """The full torchrun command line for one node of the attempt."""
    cmd = [*torchrun_prefix(), "--nnodes", str(spec.nnodes)]
    cmd += ["--nproc_per_node", str(spec.nproc_per_node)]
    if spec.nnodes == 1:
        cmd.append("--standalone")
    else:
        if not spec.rdzv_endpoint:
            raise ValueError("a multi-node launch needs rdzv_endpoint (host:port)")
        cmd += ["--rdzv-backend", "c10d", "--rdzv-id", f"{spec.job_id}-{spec.attempt}"]
        cmd += ["--rdzv-endpoint", spec.rdzv_endpoint]
        cmd += ["--rdzv-conf", f"join_timeout={spec.rdzv_timeout_s}"]
    cmd += ["--max-restarts", "0"]  # restarts are the worker's decision (a new attempt)
    cmd += [
        "-m",
        spec.trainer_module,
        "--recipe",
        str(spec.recipe_path),
        "--run-dir",
        str(spec.run_dir),
    ]
    return cmd


def build_env(spec: LaunchSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment: thread count, visible devices, backend (and on CPU the
    allocator's `CPU_ALLOCATOR_ENV`), run tag."""
    env = dict(os.environ if base is None else base)
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, spec.nproc_per_node))))
    if spec.accelerator == "cuda":
        if spec.gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_ids)
        env["TUNEYARD_DIST_BACKEND"] = "nccl"
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["TUNEYARD_DIST_BACKEND"] = "gloo"
        for key, value in CPU_ALLOCATOR_ENV.items():
            env.setdefault(key, value)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONSAFEPATH"] = "1"  # the run directory (cwd) never shadows tuneyard's packages
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGES_ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    )
    env["TUNEYARD_JOB_ID"] = spec.job_id
    env["TUNEYARD_ATTEMPT"] = str(spec.attempt)
    env[RUN_TAG_ENV] = run_tag(spec.job_id, spec.attempt, spec.node_rank)
    return env


def start_attempt(spec: LaunchSpec, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start torchrun in its own session; stdout and stderr are pipes for the log pump."""
    return subprocess.Popen(
        build_command(spec),
        env=build_env(spec),
        cwd=str(cwd or Path.cwd()),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=set_parent_death_signal,  # noqa: PLW1509 - needed between fork and exec
    )
