"""A recipe with `model.use_liger_kernel: true` trains to the end on CPU (2 gloo ranks,
FSDP2, the shard-only native load): Liger cannot run here (no CUDA, no liger_kernel), so
the loader keeps the model's own layers and the run has exactly one `kernel_fallback`
warning event naming the option and why."""

from __future__ import annotations

import pytest
from trainer_harness import Assets, base_recipe, launch

pytestmark = pytest.mark.slow


def test_liger_recipe_trains_on_cpu_with_one_fallback_event(assets: Assets) -> None:
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": 4, "val_check_interval": None, "checkpoint_interval": None},
        model={"use_liger_kernel": True},
        distributed={"strategy": "fsdp2"},
        checkpoint={"enabled": False},
    )
    run = launch(assets, "kernel-options-liger", recipe, nproc=2, timeout=300)
    assert run.returncode == 0, run.output
    assert [r["step"] for r in run.records("train")] == [1, 2, 3, 4]
    events = run.events()
    fallbacks = [e for e in events if e["event"] == "kernel_fallback"]
    assert len(fallbacks) == 1, events  # rank 0 only, once
    (fallback,) = fallbacks
    assert fallback["option"] == "model.use_liger_kernel"
    assert "cpu" in fallback["message"] and "CUDA" in fallback["message"]
    assert [e["event"] for e in events][-1] == "finished"
