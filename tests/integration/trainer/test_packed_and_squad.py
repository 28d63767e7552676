"""End-to-end single-rank runs of the other data paths: packed sequences and SQuAD data.

A packed run's validation loss must equal the loss that plain transformers computes on
the same checkpoint with unpacked, padded batches: packing changes the batch layout,
never what a token can attend to.
"""

from __future__ import annotations

import pytest
import torch
from trainer_harness import Assets, RunResult, base_recipe

from cli.demo_assets import write_squad_dir


def unpacked_val_loss(checkpoint_model_dir, dataset_factory) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.data.collate import Collator
    from trainer.loss import MaskedCrossEntropy, token_loss_sum

    model = AutoModelForCausalLM.from_pretrained(checkpoint_model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_model_dir)
    dataset = dataset_factory(tokenizer)
    batch = Collator(tokenizer.pad_token_id)([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = float(token_loss_sum(MaskedCrossEntropy(), logits, batch["labels"]))
    return loss / int((batch["labels"] != -100).sum())


def test_packed_run_trains_without_cross_sample_attention(run_main, assets: Assets) -> None:
    from trainer.data.datasets import JsonlInstructionDataset

    recipe = base_recipe(
        assets,
        step_scheduler={
            "max_steps": 8,
            "val_check_interval": 8,
            "checkpoint_interval": 8,
            "grad_accumulation_steps": 1,
        },
        packed_sequence={"enabled": True, "packed_sequence_size": 64},
        dataloader={"batch_size": 2},
    )
    code, output, events = run_main("packed", recipe)
    assert code == 0, output[-2000:]
    run = RunResult(assets.root / "runs" / "packed", code, output)
    losses = [r["loss"] for r in run.records()]
    assert len(losses) == 8 and losses[-1] < losses[0]
    expected = unpacked_val_loss(
        run.latest() / "model", lambda tok: JsonlInstructionDataset(tok, str(assets.val))
    )
    assert run.records("val")[-1]["val_loss"] == pytest.approx(expected, rel=1e-4)


def test_squad_run_trains_on_answers(run_main, assets: Assets) -> None:
    from trainer.data.datasets import SquadDataset

    squad = write_squad_dir(assets.root / "squad", n=64)
    recipe = base_recipe(
        assets, step_scheduler={"max_steps": 6, "val_check_interval": 6, "checkpoint_interval": 6}
    )
    recipe["dataset"] = {
        "_target_": "tuneyard.datasets.SquadDataset",
        "path_or_dataset": str(squad),
        "max_seq_length": 64,
    }
    recipe["validation_dataset"] = {
        "_target_": "tuneyard.datasets.SquadDataset",
        "path_or_dataset": str(squad),
        "split": "validation",
    }
    code, output, _ = run_main("squad", recipe)
    assert code == 0, output[-2000:]
    run = RunResult(assets.root / "runs" / "squad", code, output)
    assert [r["step"] for r in run.records()] == list(range(1, 7))
    expected = unpacked_val_loss(
        run.latest() / "model", lambda tok: SquadDataset(tok, str(squad), split="validation")
    )
    assert run.records("val")[-1]["val_loss"] == pytest.approx(expected, rel=1e-4)
