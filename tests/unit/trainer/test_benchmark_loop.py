"""The benchmark loop's arithmetic: the device peak behind MFU, and the summary over the
measured steps (median/mean, step-time spread, MFU null without a peak)."""

from __future__ import annotations

import pytest
import torch

from trainer.benchmark import MeasuredStep, device_peak_tflops, summarize


def _step(step: int, seconds: float, peak: float | None) -> MeasuredStep:
    tps = 1000 / seconds
    tflops = 2e9 * tps / 2 / 1e12
    return MeasuredStep(step, seconds, 1000, tps, tps / 2, tflops, tflops / peak if peak else None)


def test_cpu_has_no_known_peak_unless_the_recipe_gives_one() -> None:
    assert device_peak_tflops(torch.device("cpu"), None) is None
    assert device_peak_tflops(torch.device("cpu"), 989.0) == 989.0


def test_summary_takes_median_and_mean_of_the_measured_steps() -> None:
    steps = [_step(3, 0.5, 10.0), _step(4, 1.0, 10.0), _step(5, 2.0, 10.0)]
    summary = summarize(steps, warmup_steps=2, peak_tflops=10.0)
    assert (summary["first_measured_step"], summary["last_measured_step"]) == (3, 5)
    assert summary["measured_steps"] == 3 and summary["warmup_steps"] == 2
    assert summary["tokens_per_s"]["median"] == pytest.approx(1000.0)
    assert summary["tokens_per_s"]["mean"] == pytest.approx((2000 + 1000 + 500) / 3)
    assert summary["tokens_per_s_per_rank"]["median"] == pytest.approx(500.0)
    assert summary["tflops_per_rank"]["median"] == pytest.approx(1.0)
    assert summary["mfu"]["median"] == pytest.approx(0.1)
    assert summary["step_time_s"]["min"] == 0.5 and summary["step_time_s"]["max"] == 2.0
    assert summary["step_time_s"]["median"] == 1.0
    assert [s["step"] for s in summary["steps"]] == [3, 4, 5]


def test_summary_mfu_is_null_without_a_peak() -> None:
    summary = summarize([_step(2, 1.0, None)], warmup_steps=1, peak_tflops=None)
    assert summary["mfu"] is None and summary["peak_tflops_per_rank"] is None
    assert summary["steps"][0]["mfu"] is None
