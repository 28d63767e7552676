"""The model's forward pass on one batch: the logits every loss of the trainer starts from.

The loop, distillation, the benchmark and the resume fingerprint's probe all run the model
through here, so they feed it the same keys on the same device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.setup import TrainingRun


def model_logits(
    model: torch.nn.Module, batch: dict[str, Any], device: torch.device
) -> torch.Tensor:
    inputs = {
        k: batch[k].to(device, non_blocking=True)
        for k in ("input_ids", "attention_mask", "position_ids")
        if k in batch
    }
    return model(**inputs, use_cache=False).logits


def forward_logits(run: TrainingRun, batch: dict[str, Any]) -> torch.Tensor:
    return model_logits(run.forward_model, batch, run.env.device)
