"""LoRA under FSDP2 on 2 ranks: the checkpoint is a PEFT adapter that peft loads as is.

`AutoPeftModelForCausalLM` finds the base through `adapter_config.json` alone, offline.
"""

from __future__ import annotations

import json

import pytest
import torch
from trainer_harness import Assets, base_recipe, launch

pytestmark = pytest.mark.slow


def test_lora_adapter_loads_with_auto_peft_and_reproduces_val_loss(
    assets: Assets, offline_hub
) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    from trainer.data.collate import Collator
    from trainer.data.datasets import JsonlInstructionDataset
    from trainer.loss import MaskedCrossEntropy, token_loss_sum

    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": 6, "val_check_interval": 6, "checkpoint_interval": 6},
        distributed={"strategy": "fsdp2"},
        peft={"match_all_linear": True, "dim": 8, "alpha": 16},
        optimizer={"lr": 1.0e-2},
    )
    result = launch(assets, "lora-fsdp2", recipe, nproc=2)
    assert result.returncode == 0, result.output[-3000:]
    adapter_dir = result.latest() / "model"
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert (adapter_dir / "adapter_config.json").is_file()
    assert not (adapter_dir / "model.safetensors").exists()
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(assets.model.resolve())

    model = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    dataset = JsonlInstructionDataset(tokenizer, str(assets.val))
    batch = Collator(tokenizer.pad_token_id)([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = float(token_loss_sum(MaskedCrossEntropy(), logits, batch["labels"]))
    val_loss = loss / int((batch["labels"] != -100).sum())
    assert val_loss == pytest.approx(result.records("val")[-1]["val_loss"], rel=1e-4)
