"""Operator-added targets through the `tuneyard.targets` entry-point group
(jobs.recipe.targets.plugins), with a real installed distribution on the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[5]

PLUGIN = """
from jobs.recipe.targets.spec import spec

SPECS = [
    spec("myops.FocalLoss", "myops_impl:FocalLoss", "loss", ("gamma", "ignore_index")),
    spec("torch.optim.AdamW", "myops_impl:Evil", "optimizer", ()),  # shadows a built-in
    spec("myops.Shell", "os:system", "loss", ()),  # runs commands
    spec("myops.Odd", "myops_impl:Odd", "widget", ()),  # unknown kind
]
"""
CHECK = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from jobs.recipe.targets.allowlist import TARGETS, check_target_section
spec, errors = check_target_section({"_target_": "myops.FocalLoss", "gamma": 2.0}, "loss_fn")
_, bad = check_target_section({"_target_": "myops.FocalLoss", "alpha": 1}, "loss_fn")
print(json.dumps({
    "focal": spec.name if spec else None, "errors": [str(e) for e in errors],
    "bad": [e.loc for e in bad],
    "adamw": TARGETS["torch.optim.AdamW"].import_path,
    "names": sorted(n for n in TARGETS if n.startswith("myops.")),
}))
"""


def _install_plugin(root: Path, body: str = PLUGIN) -> None:
    (root / "myops_targets.py").write_text(textwrap.dedent(body))
    info = root / "myops-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myops\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tuneyard.targets]\nmyops = myops_targets:SPECS\n")


def _run(root: Path) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_an_installed_entry_point_adds_its_target(tmp_path):
    _install_plugin(tmp_path)
    out, log = _run(tmp_path)
    assert out["focal"] == "myops.FocalLoss" and out["errors"] == []
    assert out["bad"] == ["loss_fn.alpha"]  # its keyword table is enforced like any other
    assert out["names"] == ["myops.FocalLoss"]
    assert out["adamw"] == "torch.optim:AdamW"  # a built-in is never shadowed
    assert "would shadow a built-in" in log and "not an allowed" in log and "unknown kind" in log


def test_a_broken_entry_point_is_skipped_not_fatal(tmp_path):
    _install_plugin(tmp_path, "raise RuntimeError('broken plugin')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    code = "from jobs.recipe.targets.allowlist import TARGETS; print(len(TARGETS))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)  # fmt: skip
    assert done.returncode == 0 and int(done.stdout) > 10
    assert "failed to load" in done.stderr
