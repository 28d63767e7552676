"""The launch cannot be shadowed: packages named like tuneyard's in the run directory (the
trainer's working directory) are never imported; the real trainer trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from worker_harness import tiny_recipe

from worker.launcher import PACKAGES_ROOT, LaunchSpec, start_attempt, write_recipe

pytestmark = pytest.mark.slow

SHADOW_MAIN = "open('SHADOWED', 'w').write('the run directory was imported')\n"


def plant_shadow_packages(run_dir: Path) -> None:
    """A `trainer` that would leave a marker and succeed, and packages that cannot import."""
    for name in ("trainer", "models", "jobs"):
        package = run_dir / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            "" if name == "trainer" else f"raise ImportError('shadow {name} imported')\n"
        )
    (run_dir / "trainer" / "__main__.py").write_text(SHADOW_MAIN)


def test_without_the_safe_path_the_run_directory_would_shadow(tmp_path: Path):
    """The hazard is real: a plain `python -m trainer` in the run directory runs the shadow."""
    plant_shadow_packages(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONSAFEPATH", "PYTHONPATH"}}
    subprocess.run([sys.executable, "-m", "trainer"], cwd=tmp_path, env=env, timeout=60)
    assert (tmp_path / "SHADOWED").exists()


def test_the_trainer_trains_with_shadow_packages_in_its_run_directory(
    tmp_path, tiny_assets, monkeypatch
):
    monkeypatch.setenv("TUNEYARD_DATA_ROOTS", str(tiny_assets["model"].parent))
    monkeypatch.setenv("TUNEYARD_CHECKPOINT_ROOTS", str(tmp_path))
    run_dir = tmp_path / "run"
    plant_shadow_packages(run_dir)
    write_recipe(run_dir, tiny_recipe(tiny_assets, max_steps=3, checkpoint_every=100))
    spec = LaunchSpec(job_id="shadow", attempt=1, run_dir=run_dir)
    proc = start_attempt(spec, cwd=run_dir)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert not (run_dir / "SHADOWED").exists()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert (PACKAGES_ROOT / "trainer").is_dir()
