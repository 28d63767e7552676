"""A benchmark recipe (`recipe: llm_benchmark`) on 2 gloo ranks: warm-up and measured steps,
one MetricsSample per step, and a `benchmark_summary` whose numbers are the measured
records' (warm-up excluded); MFU is null on CPU, where the device peak is unknown."""

from __future__ import annotations

import signal
import statistics
from typing import Any

import pytest
from trainer_harness import Assets, benchmark_recipe, launch, launch_until

from jobs.recipe.exit_codes import ExitCode

pytestmark = pytest.mark.slow

WARMUP, MEASURED = 2, 4


def _recipe(assets: Assets) -> dict[str, Any]:
    return benchmark_recipe(assets, warmup=WARMUP, measured=MEASURED)


@pytest.fixture(scope="module")
def run(assets: Assets):
    result = launch(assets, "benchmark", _recipe(assets), nproc=2)
    assert result.returncode == 0, result.output
    return result


def test_every_step_writes_a_record(run) -> None:
    records = run.records()
    assert [r["step"] for r in records] == list(range(1, WARMUP + MEASURED + 1))
    assert all(r["num_tokens"] == 4 * 32 and r["tps"] > 0 for r in records)
    assert all(r["tps_per_rank"] == pytest.approx(r["tps"] / 2) for r in records)
    assert all(r["mfu"] is None for r in records)  # CPU: no known peak


def test_summary_agrees_with_the_measured_records(run) -> None:
    events = run.events()
    (summary,) = [e for e in events if e["event"] == "benchmark_summary"]
    measured = [r for r in run.records() if r["step"] > WARMUP]
    tps = [r["tps"] for r in measured]
    assert summary["measured_steps"] == MEASURED and summary["warmup_steps"] == WARMUP
    assert (summary["first_measured_step"], summary["last_measured_step"]) == (3, 6)
    assert summary["tokens_per_s"]["median"] == pytest.approx(statistics.median(tps))
    assert summary["tokens_per_s"]["mean"] == pytest.approx(statistics.fmean(tps))
    per_rank = statistics.median(r["tps_per_rank"] for r in measured)
    assert summary["tokens_per_s_per_rank"]["median"] == pytest.approx(per_rank)
    assert [s["step"] for s in summary["steps"]] == [r["step"] for r in measured]
    assert [s["tps"] for s in summary["steps"]] == pytest.approx(tps)
    tflops = [s["tflops_per_rank"] for s in summary["steps"]]
    assert all(t > 0 for t in tflops)
    assert summary["tflops_per_rank"]["median"] == pytest.approx(statistics.median(tflops))
    assert summary["mfu"] is None and summary["peak_tflops_per_rank"] is None
    times = [s["step_time_s"] for s in summary["steps"]]
    assert summary["step_time_s"]["min"] == min(times) and summary["step_time_s"]["max"] == max(
        times
    )
    assert [e["event"] for e in events][-2:] == ["benchmark_summary", "finished"]


def test_no_checkpoint_by_default(run) -> None:
    assert not (run.run_dir / "checkpoints").exists()
    assert not any(e["event"] == "checkpoint_saved" for e in run.events())


def test_a_given_peak_makes_mfu_tflops_over_peak(assets: Assets) -> None:
    recipe = _recipe(assets)
    recipe["benchmark"] = {"warmup_steps": 1, "measured_steps": 2, "peak_tflops": 0.5}
    result = launch(assets, "benchmark-peak", recipe, nproc=2)
    assert result.returncode == 0, result.output
    (summary,) = [e for e in result.events() if e["event"] == "benchmark_summary"]
    records = {r["step"]: r for r in result.records()}
    for step in summary["steps"]:
        assert step["mfu"] == pytest.approx(step["tflops_per_rank"] / 0.5)
        assert records[step["step"]]["mfu"] == pytest.approx(step["mfu"])
    assert summary["peak_tflops_per_rank"] == 0.5 and summary["mfu"]["median"] > 0


def test_sigterm_ends_a_benchmark_preempted_without_a_summary(assets: Assets) -> None:
    recipe = _recipe(assets)
    recipe["benchmark"] = {"warmup_steps": 1, "measured_steps": 100_000}
    run_dir = assets.root / "runs" / "benchmark-sigterm"
    result = launch_until(assets, "benchmark-sigterm", recipe, 1, run_dir, step=3,
                          sig=signal.SIGTERM)  # fmt: skip
    assert result.returncode == ExitCode.PREEMPTED, result.output[-2000:]
    events = [e["event"] for e in result.events()]
    assert events[-1] == "preempted" and "benchmark_summary" not in events
