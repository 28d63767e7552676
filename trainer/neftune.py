"""NEFTune: uniform noise on the input embeddings of every training forward.

`attach_neftune` puts a forward hook on the model's input embedding (`neftune:` in the
recipe, `jobs.recipe.sections.neftune`): while the module is in training mode and autograd
records (a training step; validation runs under `no_grad`), the embedding output gets
noise drawn uniformly from [-m, m] with m = noise_alpha / sqrt(seq_len * hidden_size), the
scale of the NEFTune paper and of AutoModel's hook. Validation already refused the layouts
where ranks would need the same noise (tensor, context and pipeline parallelism).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from jobs.recipe.typed import Neftune
from trainer.errors import data_error


def input_embedding(model: nn.Module) -> nn.Module:
    """The module that embeds input ids: the model's own answer, else its `embed_tokens`."""
    getter = getattr(model, "get_input_embeddings", None)
    found = getter() if callable(getter) else None
    if isinstance(found, nn.Module):
        return found
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("embed_tokens", "wte") and isinstance(module, nn.Module):
            return module
    raise data_error("neftune: the model has no input embedding to add noise to; remove neftune")


def noise_hook(noise_alpha: float) -> Any:
    """The forward hook: the embedding output plus NEFTune noise on training forwards."""

    def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        if not (module.training and torch.is_grad_enabled()):
            return output
        magnitude = noise_alpha / math.sqrt(output.size(1) * output.size(2))
        return output + torch.empty_like(output).uniform_(-magnitude, magnitude)

    return hook


def attach_neftune(model: nn.Module, config: Neftune | None) -> RemovableHandle | None:
    """Hook NEFTune noise onto `model`'s input embedding (None without a `neftune:`)."""
    if config is None or config.noise_alpha == 0:
        return None
    return input_embedding(model).register_forward_hook(noise_hook(config.noise_alpha))
