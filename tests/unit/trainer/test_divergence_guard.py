"""The divergence guard and the step-row tracker without a model: the moving-median spike
rule, what is a divergence, the default failure naming the rows, the retry bound, and
the positions a step draws (skipped ones never drawn) turned into every rank's rows."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.typed import Recovery, SpikeRule
from trainer.data.sampler import ResumableBatchSampler
from trainer.errors import TrainerError
from trainer.resilience.recovery import DivergenceGuard, scale_lr, spike_threshold
from trainer.sample_log import StepRows


def fake_run(num_samples: int = 32, batch: int = 2, dp_size: int = 2) -> SimpleNamespace:
    sampler = ResumableBatchSampler(num_samples, batch, 0, dp_size, shuffle=True, seed=3)
    loader = DataLoader(list(range(num_samples)), batch_sampler=sampler)
    return SimpleNamespace(train_loader=loader, step=0, skipped_batches=set(),
                           data_state={"epoch": 0, "batches_done": 0})  # fmt: skip


def test_spike_threshold_is_factor_times_the_median_of_a_full_window() -> None:
    history = {1: 1.0, 2: 9.0, 3: 2.0, 4: 3.0}
    assert spike_threshold(history, 5, factor=2.0, window=3) == 6.0  # median(9, 2, 3) = 3
    assert spike_threshold(history, 5, factor=2.0, window=5) == math.inf  # not full yet


def test_nan_always_diverges_a_spike_only_with_the_rule(tmp_path) -> None:
    rows = StepRows(tmp_path, is_rank0=False)
    off = DivergenceGuard(Recovery(), rows)
    spiky = DivergenceGuard(Recovery(on_spike=SpikeRule(factor=3.0, window=3)), rows)
    for guard in (off, spiky):
        guard.history = {1: 1.0, 2: 1.2, 3: 0.8}
        assert guard.reason(float("nan"), 4) == "nan" and guard.reason(math.inf, 4) == "nan"
        assert guard.reason(2.9, 4) is None
    assert off.reason(50.0, 4) is None and spiky.reason(50.0, 4) == "spike"


def test_tracked_skips_positions_and_rows_cover_every_rank(tmp_path) -> None:
    run = fake_run()
    run.skipped_batches = {(0, 1)}

    def stream():
        for number in range(4):
            run.data_state["batches_done"] = number + 1
            yield 0, {"n": number}

    rows = StepRows(tmp_path, is_rank0=True)
    drawn = [batch["n"] for _, batch in rows.tracked(stream(), run)]
    assert drawn == [0, 2, 3] and rows.take() == [(0, 0), (0, 2), (0, 3)] and rows.take() == []
    got = rows.rows(run, [(0, 2)])
    for rank in (0, 1):
        sampler = ResumableBatchSampler(32, 2, rank, 2, shuffle=True, seed=3)
        want = list(iter(sampler))[2]
        assert [r["index"] for r in got if r["dp_rank"] == rank] == want
    assert {r["micro_batch"] for r in got} == {0}


def test_default_fails_at_a_nan_naming_the_rows(tmp_path) -> None:
    run = fake_run()
    run.step = 7
    guard = DivergenceGuard(Recovery(), StepRows(tmp_path, is_rank0=False))
    with pytest.raises(TrainerError) as failed:
        guard.check(run, None, float("nan"), [(0, 0)])
    indices = [r["index"] for r in guard.rows.rows(run, [(0, 0)])]
    assert failed.value.exit_code == ExitCode.NAN_LOSS
    assert "at step 7" in failed.value.message
    assert "dataset rows " + ", ".join(map(str, indices)) in failed.value.message
    assert guard.check(run, None, 1.5, [(0, 1)]) is False and guard.history == {7: 1.5}


def test_after_max_retries_the_next_divergence_fails(tmp_path) -> None:
    run = fake_run()
    guard = DivergenceGuard(Recovery(on_nan="rollback", max_retries=2), StepRows(tmp_path, False))
    guard.rollbacks = 2
    with pytest.raises(TrainerError, match=r"after 2 rollbacks \(recovery.max_retries\)"):
        guard.check(run, None, float("nan"), [(0, 0)])


def test_scale_lr_scales_groups_and_the_schedule_base() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    run = SimpleNamespace(optimizer=optimizer, scheduler=scheduler)
    scale_lr(run, 0.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert scheduler.base_lrs == [pytest.approx(0.05)]
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_rows_carry_the_datasets_id_column_and_a_capped_preview(tmp_path, tokenizer) -> None:
    from trainer.data.datasets import JsonlInstructionDataset
    from trainer.sample_log import PREVIEW_CHARS, preview_line

    data = tmp_path / "rows.jsonl"
    lines = [f'{{"id": "ex-{i}", "prompt": "Reverse {i} {i + 1}:", "completion": " {i + 1} {i}"}}'
             for i in range(8)]  # fmt: skip
    data.write_text("\n".join(lines) + "\n")
    dataset = JsonlInstructionDataset(tokenizer, str(data))
    sampler = ResumableBatchSampler(8, 2, 0, 1, shuffle=True, seed=1)
    run = SimpleNamespace(train_loader=DataLoader(dataset, batch_sampler=sampler),
                          tokenizer=tokenizer)  # fmt: skip
    rows = StepRows(tmp_path, is_rank0=True).rows(run, [(0, 1)])
    assert [r["id"] for r in rows] == [f"ex-{i}" for i in list(iter(sampler))[1]]
    line = preview_line(run, rows[0])
    assert line["id"] == rows[0]["id"] and line["tokens"] == len(
        dataset[rows[0]["index"]]["input_ids"]
    )
    assert (
        f"Reverse {rows[0]['index']}" in line["preview"] and len(line["preview"]) <= PREVIEW_CHARS
    )
