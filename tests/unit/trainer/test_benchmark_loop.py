"""The benchmark loop's arithmetic: the device peak behind MFU, the summary over the
measured steps (median/mean, step-time spread, MFU null without a peak), and a step's
FLOPs counted as training counts them: per-layer sizes included, null (with one warning)
for a config the counter cannot read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jobs.recipe.plan.flops import flops_breakdown
from trainer import benchmark
from trainer.benchmark import MeasuredStep, device_peak_tflops, summarize
from trainer.metrics import StepMeter


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


def _run_and_one_step(monkeypatch: pytest.MonkeyPatch, seq_len: int) -> SimpleNamespace:
    """A run whose timed step took 0.5 s for 1000 tokens on 2 ranks (1000 tokens/s a rank)."""
    batch = {"input_ids": torch.zeros(2, seq_len, dtype=torch.long)}
    monkeypatch.setattr(
        benchmark, "_timed_step", lambda run, stream: (0, [batch], 0.5, (1.0, 0.5, 1000))
    )
    env = SimpleNamespace(world_size=2, device=torch.device("cpu"))
    return SimpleNamespace(optimizer=SimpleNamespace(param_groups=[{"lr": 1e-3}]), step=0, env=env)


def test_a_step_counts_a_per_layer_model_as_the_training_loop_does(monkeypatch) -> None:
    """Gemma-4's wider full-attention heads (a per-layer head_dim) are counted: TFLOP/s and
    MFU from the same count as validation's, with no warning."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=8, global_head_dim=16, sliding_window=8,
                              hidden_size_per_layer_input=4, vocab_size_per_layer_input=64)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    warnings: list[str] = []
    meter = StepMeter(model, torch.device("cpu"), 2, warn=warnings.append)
    run = _run_and_one_step(monkeypatch, seq_len=32)
    _, sample = benchmark.benchmark_step(run, iter(()), 10.0, meter)
    expected = flops_breakdown(model.config.to_dict(), 32).total * 1000 / 1e12
    assert sample.tflops_per_rank == pytest.approx(expected) and expected > 0
    assert sample.mfu == pytest.approx(expected / 10.0) and warnings == []


class _Unreadable:
    """A config whose sizes cannot be read (a layout the FLOP counter does not know)."""

    @property
    def hidden_size(self) -> int:
        raise ValueError("sizes differ per layer")


def test_an_uncountable_config_leaves_tflops_and_mfu_null_and_warns_once(monkeypatch) -> None:
    model = torch.nn.Linear(2, 2)
    model.config = _Unreadable()
    warnings: list[str] = []
    meter = StepMeter(model, torch.device("cpu"), 2, warn=warnings.append)
    run = _run_and_one_step(monkeypatch, seq_len=16)
    steps = [benchmark.benchmark_step(run, iter(()), 10.0, meter)[1] for _ in range(3)]
    assert all(s.tflops_per_rank is None and s.mfu is None and s.tps_per_rank > 0 for s in steps)
    assert len(warnings) == 1 and "sizes differ per layer" in warnings[0]
    summary = summarize(steps, warmup_steps=0, peak_tflops=10.0)
    assert summary["tflops_per_rank"] is None and summary["mfu"] is None
    assert summary["tokens_per_s_per_rank"]["median"] == pytest.approx(1000.0)
