"""Two-rank torchrun runs (gloo) with DDP, FSDP2 and tp=2: records, validation, checkpoints.

Each strategy trains the tiny Llama once (session fixture); the tests read its run dir.
The final consolidated checkpoint is loaded with plain transformers (offline) and must
reproduce the trainer's last validation loss, i.e. the same logits as the trained, sharded
model; its tokenizer, chat template and generation config load beside it.
"""

from __future__ import annotations

import math

import pytest
from trainer_harness import STRATEGIES, Assets, RunResult, strategy_run, transformers_val_loss

TRAIN_FIELDS = {
    "kind",
    "step",
    "epoch",
    "loss",
    "grad_norm",
    "lr",
    "mem",
    "tps",
    "tps_per_rank",
    "mfu",
    "num_tokens",
    "timestamp",
}

pytestmark = pytest.mark.slow


@pytest.fixture(params=sorted(STRATEGIES))
def parallel_run(request: pytest.FixtureRequest, assets: Assets) -> RunResult:
    return strategy_run(assets, request.param)


def test_every_step_has_one_complete_train_record(parallel_run: RunResult) -> None:
    assert parallel_run.returncode == 0, parallel_run.output[-3000:]
    records = parallel_run.records("train")
    assert [r["step"] for r in records] == list(range(1, 31))
    for record in records:
        assert set(record) == TRAIN_FIELDS
        assert all(math.isfinite(record[k]) for k in TRAIN_FIELDS - {"kind", "mfu"})
        assert record["tps"] > 0 and record["mem"] > 0
        assert record["mfu"] is None  # no known peak on CPU: no MFU rather than a guess
        assert record["tps_per_rank"] == pytest.approx(record["tps"] / 2)
        assert record["num_tokens"] > 0


def test_epoch_follows_the_data_position(parallel_run: RunResult) -> None:
    dp = 1 if "tp2" in parallel_run.run_dir.name else 2
    batches_per_epoch = 256 // (4 * dp)  # samples // (batch_size * dp ranks)
    for record in parallel_run.records("train"):
        assert record["epoch"] == (record["step"] - 1) * 2 // batches_per_epoch  # 2: grad acc


def test_loss_falls(parallel_run: RunResult) -> None:
    losses = [r["loss"] for r in parallel_run.records("train")]
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_validation_and_checkpoints_at_their_intervals(parallel_run: RunResult) -> None:
    assert [r["step"] for r in parallel_run.records("val")] == [10, 20, 30]
    events = parallel_run.events()
    assert events[0]["event"] == "started" and events[-1]["event"] == "finished"
    saved = [e for e in events if e["event"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [10, 20, 30]
    assert all(e["size_bytes"] > 0 and e["metrics"]["step"] == e["step"] for e in saved)
    assert parallel_run.latest().name == "step_30"
    kept = sorted(p.name for p in (parallel_run.run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_20", "step_30"]  # checkpoint.keep_last: 2


def test_final_checkpoint_loads_with_transformers_and_matches(
    parallel_run: RunResult, assets: Assets, offline_hub
) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    model_dir = parallel_run.latest() / "model"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|user|>hi<|end|><|assistant|>"
    generation = GenerationConfig.from_pretrained(model_dir)
    assert generation.to_dict() == GenerationConfig.from_pretrained(assets.model).to_dict()
    val_loss = transformers_val_loss(model_dir, assets.val)
    assert val_loss == pytest.approx(parallel_run.records("val")[-1]["val_loss"], rel=1e-4)
