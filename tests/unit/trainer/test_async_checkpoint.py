"""Asynchronous checkpoint saves: the background publish, its snapshots and its waits.

The manager's publish runs on a thread; these tests hold it at chosen points (an unset
shard future, a slow model writer, the test pacing variable) and check that LATEST moves
only when the whole checkpoint is on disk, that the next save waits, that a failure
leaves LATEST alone, and that what is written is the state at the save, not the state
the step loop has moved on to.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from trainer.checkpoint import consolidate, manager
from trainer.checkpoint.manager import PUBLISH_DELAY_ENV, STATE_FILE, CheckpointManager
from trainer.errors import TrainerError


def _latest_name(root: Path) -> str | None:
    pointer = root / "checkpoints" / "LATEST"
    return pointer.read_text().strip() if pointer.exists() else None


def _write_weights(staging: Path) -> None:
    (staging / "model").mkdir(exist_ok=True)
    (staging / "model" / "model.safetensors").write_bytes(b"weights")


def _sync_publish(ckpt: CheckpointManager, step: int) -> None:
    _write_weights(ckpt.begin(step))
    ckpt.publish(step, {"step": step})


def test_latest_moves_only_once_shards_model_and_state_are_written(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, is_rank0=True, is_async=True)
    _sync_publish(ckpt, 1)
    staging = ckpt.begin(2)
    shards: Future = Future()
    ckpt.publish_async(2, {"step": 2}, shards, lambda: _write_weights(staging), {"loss": 1.5})
    time.sleep(0.2)
    assert ckpt.in_flight() and ckpt.completed() == []
    assert _latest_name(tmp_path) == "step_1" and staging.is_dir()
    assert not (staging / STATE_FILE).exists() and not manager.is_complete(staging)
    assert ckpt.resolve(None) == tmp_path / "checkpoints" / "step_1"

    shards.set_result(None)
    [published] = ckpt.wait()
    final = tmp_path / "checkpoints" / "step_2"
    assert (published.step, published.path, published.metrics) == (2, final, {"loss": 1.5})
    assert published.size_bytes == manager.dir_size(final) > 0
    assert _latest_name(tmp_path) == "step_2" and not staging.exists()
    assert (final / "model" / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((final / STATE_FILE).read_text()) == {"step": 2}
    assert ckpt.wait() == []  # each save is reported once


def test_the_next_save_waits_for_the_one_in_flight(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, is_rank0=True, is_async=True, keep_last=1)
    staging = ckpt.begin(1)
    shards: Future = Future()
    threading.Timer(0.4, shards.set_result, args=(None,)).start()
    start = time.perf_counter()
    ckpt.publish_async(1, {"step": 1}, shards, lambda: _write_weights(staging))
    assert time.perf_counter() - start < 0.2  # publish_async does not block
    ckpt.begin(2)
    assert time.perf_counter() - start >= 0.35  # begin waited for step 1 to publish
    assert _latest_name(tmp_path) == "step_1"
    assert [p.step for p in ckpt.completed()] == [1]


def test_a_failed_background_save_is_a_checkpoint_error_and_latest_stays(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, is_rank0=True, is_async=True)
    _sync_publish(ckpt, 1)
    staging = ckpt.begin(2)

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    ckpt.publish_async(2, {"step": 2}, None, disk_full)
    with pytest.raises(TrainerError) as info:
        ckpt.wait()
    assert info.value.exit_code == ExitCode.CHECKPOINT_ERROR
    assert "No space left" in info.value.message and "previous checkpoint" in info.value.message
    assert _latest_name(tmp_path) == "step_1" and not manager.is_complete(staging)
    ckpt.remove_stale_staging()  # what the rerun does first
    assert not staging.exists() and ckpt.latest() == tmp_path / "checkpoints" / "step_1"


def test_the_pacing_variable_holds_the_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PUBLISH_DELAY_ENV, "0.5")
    ckpt = CheckpointManager(tmp_path, is_rank0=True, is_async=True)
    staging = ckpt.begin(3)
    start = time.perf_counter()
    ckpt.publish_async(3, {"step": 3}, None, lambda: _write_weights(staging))
    time.sleep(0.2)
    assert ckpt.in_flight() and _latest_name(tmp_path) is None
    assert [p.step for p in ckpt.wait()] == [3]
    assert time.perf_counter() - start >= 0.5 and _latest_name(tmp_path) == "step_3"


def test_async_optimizer_save_writes_the_state_of_the_save_step(
    tmp_path: Path, single_rank_group
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)

    def step() -> None:
        model(torch.randn(8, 64)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    at_save = {k: v["exp_avg"].clone() for k, v in optimizer.state.items()}
    future = manager.async_save_optimizer(model, optimizer, None, tmp_path / "optim", None)
    for _ in range(3):  # the step loop goes on while the save is written
        step()
    future.result()

    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    manager.load_optimizer(model, fresh, None, tmp_path / "optim")
    for key, expected in at_save.items():
        torch.testing.assert_close(fresh.state[key]["exp_avg"], expected, rtol=0, atol=0)
    first = next(iter(at_save))
    assert not torch.equal(optimizer.state[first]["exp_avg"], at_save[first])  # it did move on


def test_consolidated_snapshot_is_the_model_at_the_save(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        snapshot = consolidate.snapshot_consolidated_model(model, is_rank0=True)
        for param in model.parameters():  # the next optimizer steps
            param.add_(0.5)
    assert snapshot is not None
    consolidate.write_consolidated_snapshot(snapshot, tmp_path / "model")
    consolidate.save_consolidated_model(model, tmp_path / "moved", is_rank0=True)
    names = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "moved").iterdir())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected)


def test_a_non_zero_rank_snapshots_nothing(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    assert consolidate.snapshot_consolidated_model(model, is_rank0=False) is None
