"""The pretraining datasets under the real trainer: 2 CPU ranks (torchrun), a tiny Llama,
token files written by the test, loss falling; and an exact resume on Megatron data.

The Megatron run is also the reference of the resume test: a run of the same recipe,
SIGKILLed after its first checkpoint and rerun, must continue with the same losses, which
it can only do if it reads exactly the samples the killed run had not reached.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from token_corpora import learnable_documents, write_megatron, write_nanogpt_shard
from trainer_harness import Assets, base_recipe, launch, launch_until

pytestmark = pytest.mark.slow

STEPS, SEQ = 12, 32
_runs: dict = {}


def _recipe(assets: Assets, dataset: dict) -> dict:
    recipe = base_recipe(
        assets,
        validation_dataset=None,
        distributed={"strategy": "ddp"},
        dataloader={"batch_size": 4, "shuffle": True},
    )
    recipe["dataset"] = dataset  # replaced, not merged into the harness's JSONL dataset
    recipe["step_scheduler"] = {"max_steps": STEPS, "grad_accumulation_steps": 1,
                                "checkpoint_interval": 6}  # fmt: skip
    return recipe


def _megatron_recipe(assets: Assets) -> dict:
    root = assets.root / "data" / "megatron"
    web = write_megatron(root / "web_text_document", learnable_documents(60, 40, 10, 40, seed=1))
    code = write_megatron(root / "code_text_document", learnable_documents(60, 40, 40, 70, seed=2))
    (root / "maps").mkdir(exist_ok=True)
    dataset = {"_target_": "nemo_automodel.components.datasets.llm.megatron_dataset.MegatronPretraining",
               "paths": [0.6, f"{web}.bin", 0.4, f"{code}.bin"], "seq_length": SEQ,
               "split": "0.99, 0.01, 0", "index_mapping_dir": str(root / "maps"),
               "splits_to_build": "train"}  # fmt: skip
    return _recipe(assets, dataset)


def _run(assets: Assets, name: str, recipe: dict):
    if name not in _runs:
        _runs[name] = launch(assets, name, recipe, nproc=2)
    return _runs[name]


def _assert_learns(result) -> list[float]:
    assert result.returncode == 0, result.output[-3000:]
    losses = [r["loss"] for r in result.records("train")]
    assert len(losses) == STEPS
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    return losses


def test_megatron_blend_trains_on_two_ranks(assets: Assets) -> None:
    _assert_learns(_run(assets, "pretrain-megatron", _megatron_recipe(assets)))


def test_nanogpt_shards_train_on_two_ranks(assets: Assets) -> None:
    root = assets.root / "data" / "nanogpt"
    for i in range(2):
        docs = learnable_documents(40, 50, 10, 60, seed=i)
        write_nanogpt_shard(root / f"fineweb_train_{i:06d}.bin", np.concatenate(docs))
    dataset = {"_target_": "nemo_automodel.components.datasets.llm.nanogpt_dataset.NanogptDataset",
               "file_pattern": [str(p) for p in sorted(root.glob("*.bin"))], "seq_len": SEQ,
               "shuffle_files": True}  # fmt: skip
    _assert_learns(_run(assets, "pretrain-nanogpt", _recipe(assets, dataset)))


def test_mock_benchmark_dataset_runs_on_two_ranks(assets: Assets) -> None:
    """Random tokens have nothing to learn but their unigram spread: the loss still falls from
    the untrained model's towards ln(vocab)."""
    dataset = {"_target_": "nemo_automodel.components.datasets.llm.mock_iterable_dataset."
               "MockIterableDataset", "vocab_size": 16, "seq_len": SEQ, "num_samples": 256}  # fmt: skip
    _assert_learns(_run(assets, "pretrain-mock", _recipe(assets, dataset)))


def test_killed_megatron_run_resumes_on_the_unseen_samples(assets: Assets) -> None:
    recipe = _megatron_recipe(assets)
    clean = _run(assets, "pretrain-megatron", recipe)
    assert clean.returncode == 0, clean.output[-3000:]
    run_dir = assets.root / "runs" / "pretrain-megatron-killed"
    killed = launch_until(assets, "pretrain-megatron-killed", recipe, 2, run_dir, step=7,
                          sig=signal.SIGKILL)  # fmt: skip
    assert killed.returncode != 0
    resumed = launch(assets, "pretrain-megatron-killed", recipe, nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.output[-3000:]
    start = next(e for e in resumed.events() if e["event"] == "resumed")["step"]
    assert start == 6
    expected = {r["step"]: r["loss"] for r in clean.records("train")}
    got = {r["step"]: r["loss"] for r in resumed.records("train")}
    for step in range(start + 1, STEPS + 1):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step
