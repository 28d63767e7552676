"""Two-rank torchrun runs of the real trainer on AutoModel's SFT datasets, written as AutoModel
recipes write them: HellaSwag (parquet, packed), ChatDataset (tool calls, a `tokenizer:`
section naming NeMoAutoTokenizer) and ColumnMappedTextInstructionDataset (CSV). Each loss
falls; a rerun of the same job reads the tokenized rows from the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sft_fixtures import (
    TOOL_TEMPLATE,
    chat_rows,
    hellaswag_rows,
    instruction_rows,
    write_csv,
    write_jsonl,
    write_parquet,
)
from trainer_harness import Assets, base_recipe, launch

pytestmark = pytest.mark.slow

LLM = "nemo_automodel.components.datasets.llm"
STEPS = 12


def _datasets(kind: str, data: Path, model: Path) -> dict[str, Any]:
    if kind == "hellaswag":
        train = write_parquet(data / "hellaswag" / "train.parquet", hellaswag_rows(256))
        block = {"_target_": f"{LLM}.hellaswag.HellaSwag", "path_or_dataset": str(train)}
        return {"dataset": {**block, "split": "train"},
                "validation_dataset": {**block, "split": "train[:16]", "num_samples_limit": 8},
                "packed_sequence": {"packed_sequence_size": 64}}  # fmt: skip
    if kind == "chat":
        train = write_jsonl(data / "chat" / "train.jsonl", chat_rows(256))
        block = {"_target_": f"{LLM}.chat_dataset.ChatDataset", "path_or_dataset_id": str(train),
                 "seq_length": 256, "chat_template": TOOL_TEMPLATE}  # fmt: skip
        return {"dataset": {**block, "split": "train"},
                "validation_dataset": {**block, "split": "validation[:16]"},
                "tokenizer": {"_target_": "nemo_automodel.NeMoAutoTokenizer.from_pretrained",
                              "pretrained_model_name_or_path": str(model)}}  # fmt: skip
    train = write_csv(data / "prompt_completion" / "train.csv", instruction_rows(256))
    block = {"_target_": f"{LLM}.column_mapped_text_instruction_dataset."
             "ColumnMappedTextInstructionDataset", "path_or_dataset_id": str(train),
             "column_mapping": {"question": "instruction", "answer": "output"},
             "seq_length": 64, "answer_only_loss_mask": True, "truncation": "longest_first"}  # fmt: skip
    return {"dataset": {**block, "split": "train"},
            "validation_dataset": {**block, "split": "train[:16]", "limit_dataset_samples": 8}}  # fmt: skip


@pytest.mark.parametrize("kind", ["hellaswag", "chat", "column_mapped"])
def test_two_ranks_train_on_an_automodel_sft_dataset(
    assets: Assets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    steps = {"max_steps": STEPS, "num_epochs": 20, "val_check_interval": STEPS,
             "checkpoint_interval": STEPS}  # fmt: skip
    recipe = base_recipe(assets, step_scheduler=steps, checkpoint={"enabled": False})
    recipe.update(_datasets(kind, assets.root / "data" / kind, assets.model))
    run = launch(assets, f"sft-{kind}", recipe, nproc=2, timeout=180)
    assert run.returncode == 0, run.output[-3000:]
    losses = [r["loss"] for r in run.records()]
    assert len(losses) == STEPS
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert run.records("val"), "the validation split was read too"
    cached = sorted((tmp_path / "hf-datasets" / "tuneyard-tokenized").glob("*.arrow"))
    assert len(cached) == 2  # train and validation, tokenized once for both ranks
