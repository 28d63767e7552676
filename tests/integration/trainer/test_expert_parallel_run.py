"""A two-rank torchrun run (gloo, FSDP2) of a tiny Qwen3-MoE with `distributed.ep_size: 2`.

Each rank holds half of every layer's experts (activation checkpointing on, so the
expert-parallel collectives also run in the recomputed forward). The run trains 10 steps (loss falls) and
saves a checkpoint whose consolidated model holds ALL experts: plain transformers loads it
and reproduces the trainer's validation loss. A second launch resumes from that
checkpoint (the expert slices come back from the full weights, the optimizer state from
DCP) and trains on to step 14.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import Assets, RunResult, base_recipe, launch, transformers_val_loss

pytestmark = pytest.mark.slow


def build_tiny_qwen3_moe(directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from cli.demo_assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def ep_runs(assets: Assets) -> tuple[RunResult, RunResult, dict]:
    model = build_tiny_qwen3_moe(assets.root / "tiny-qwen3-moe")
    recipe = base_recipe(
        assets,
        distributed={"strategy": "fsdp2", "ep_size": 2, "activation_checkpointing": True},
        step_scheduler={"max_steps": 10, "grad_accumulation_steps": 1},
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    first = launch(assets, "ep2", recipe, nproc=2)
    resumed_recipe = {**recipe, "step_scheduler": {**recipe["step_scheduler"], "max_steps": 14}}
    resumed = launch(assets, "ep2-resume", resumed_recipe, nproc=2, run_dir=first.run_dir)
    return first, resumed, recipe


def test_ep_run_trains_and_loss_falls(ep_runs) -> None:
    first, _, _ = ep_runs
    assert first.returncode == 0, first.output[-3000:]
    losses = [r["loss"] for r in first.records("train")][:10]  # the resume appends 11-14
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses


def test_ep_checkpoint_is_the_full_model_for_transformers(ep_runs, assets: Assets) -> None:
    from transformers import AutoConfig

    first, _, _ = ep_runs
    model_dir = first.run_dir / "checkpoints" / "step_10" / "model"
    assert AutoConfig.from_pretrained(model_dir).num_experts == 4
    val = [r for r in first.records("val") if r["step"] == 10]
    assert val and transformers_val_loss(model_dir, assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )


def test_ep_run_resumes_from_its_checkpoint(ep_runs) -> None:
    _, resumed, _ = ep_runs
    assert resumed.returncode == 0, resumed.output[-3000:]
    events = resumed.events()
    assert any(e["event"] == "resumed" and e["step"] == 10 for e in events), events
    records = resumed.records("train")  # one metrics.jsonl for both launches
    assert [r["step"] for r in records] == list(range(1, 15))
    assert max(r["loss"] for r in records[10:]) < 0.8 * records[0]["loss"]
