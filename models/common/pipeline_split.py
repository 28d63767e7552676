"""Splitting a native decoder-only causal LM into pipeline stages, Hugging Face names kept.

A pipeline stage is a contiguous run of decoder layers; stage 0 also owns the token
embeddings and the last stage the final norm and `lm_head`. `stage_layer_ranges` decides
which layers each stage gets (an even split, earlier stages taking the remainder, or
exactly `layers_per_stage` each). `split_model` prunes the full model in place down to
what this rank's stages own and returns that pruned model (its parameter names are the
full model's, `model.layers.<i>...`, so optimizer state and consolidated checkpoints
keep Hugging Face names) together with one `StageModule` per local stage: the module a
`torch.distributed.pipelining.PipelineStage` runs, sharing the pruned model's submodules.
`StageLayers` is the `nn.ModuleList` that keeps the original layer indices as its names
while indexing positionally, so sharding code that walks "the `layers` list" works on a
stage unchanged. Every stage computes its own rotary embeddings and attention mask from
the `position_ids` / `attention_mask` each stage is handed (the schedule passes keyword
inputs to every stage), so only the hidden states cross stage boundaries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from models.common.layers import DecoderModel, run_layers


class StageLayers(nn.ModuleList):
    """Decoder layers named by their index in the full model, indexed by position."""

    def __init__(self, indexed: Iterable[tuple[int, nn.Module]] = ()) -> None:
        super().__init__()
        for index, layer in indexed:
            self.add_module(str(index), layer)

    def _key(self, position: int) -> str:
        keys = list(self._modules)
        if not -len(keys) <= position < len(keys):
            raise IndexError(f"layer position {position} out of range ({len(keys)} layers)")
        return keys[position]

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return list(self._modules.values())[position]
        return self._modules[self._key(position)]

    def __setitem__(self, position: int, module: nn.Module) -> None:
        self._modules[self._key(position)] = module

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())

    def indices(self) -> list[int]:
        """The full model's layer index of each layer here, in order."""
        return [int(key) for key in self._modules]


def stage_layer_ranges(
    num_layers: int, num_stages: int, layers_per_stage: int | None = None
) -> list[range]:
    """The decoder layers of each stage; ValueError when they cannot be split so."""
    if layers_per_stage is not None:
        if layers_per_stage * num_stages != num_layers:
            raise ValueError(
                f"layers_per_stage {layers_per_stage} x {num_stages} stages does not cover "
                f"the model's {num_layers} decoder layers"
            )
        return [range(s * layers_per_stage, (s + 1) * layers_per_stage) for s in range(num_stages)]
    if num_layers < num_stages:
        raise ValueError(
            f"the model has {num_layers} decoder layers, fewer than the {num_stages} "
            "pipeline stages"
        )
    base, extra = divmod(num_layers, num_stages)
    ranges, start = [], 0
    for stage in range(num_stages):
        size = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


class StageModule(nn.Module):
    """One pipeline stage: [embeddings] -> its decoder layers -> [final norm, lm_head].

    The first stage takes token ids, the others the previous stage's hidden states; the
    last returns logits, the others hidden states. `position_ids` and `attention_mask`
    (the batch's, micro-batched like the inputs) reach every stage.
    """

    def __init__(
        self,
        config: Any,
        layers: StageLayers,
        rotary_emb: nn.Module,
        embed_tokens: nn.Module | None = None,
        norm: nn.Module | None = None,
        lm_head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.rotary_emb = rotary_emb

    def forward(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.embed_tokens(inputs) if self.embed_tokens is not None else inputs
        hidden = run_layers(self.layers, self.rotary_emb, hidden, attention_mask, position_ids)
        if self.norm is not None:
            hidden = self.norm(hidden)
        return self.lm_head(hidden) if self.lm_head is not None else hidden


def split_unsupported_reason(model: nn.Module) -> str | None:
    """Why `model` cannot be split into stages (None when it can)."""
    backbone = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    head = getattr(head, "base_layer", head)  # a LoRA-wrapped head: its linear layer
    if not isinstance(backbone, DecoderModel) or not isinstance(head, nn.Linear):
        return (
            f"{type(model).__name__} is not a native decoder stack (model.embed_tokens, "
            "model.layers, model.norm, lm_head); pipeline stages split tuneyard's native "
            "model classes"
        )
    if model.lm_head.weight is backbone.embed_tokens.weight:
        return (
            "the model ties lm_head to the token embeddings, which live on different "
            "pipeline stages; use a checkpoint with tie_word_embeddings: false"
        )
    return None


def split_model(
    model: nn.Module, stage_ids: list[int], ranges: list[range]
) -> tuple[nn.Module, list[StageModule]]:
    """Prune `model` in place to the stages in `stage_ids`; returns it and their modules.

    `ranges[s]` are the layers of stage `s` (of `len(ranges)` stages in all). What no
    local stage owns is dropped (set to None, or left out of `model.layers`), so the
    pruned model's parameters are exactly this rank's, under their full-model names.
    """
    reason = split_unsupported_reason(model)
    if reason:
        raise ValueError(reason)
    backbone, last = model.model, len(ranges) - 1
    full_layers = list(backbone.layers)
    stages = []
    for stage in stage_ids:
        stages.append(
            StageModule(
                model.config,
                StageLayers((i, full_layers[i]) for i in ranges[stage]),
                backbone.rotary_emb,
                embed_tokens=backbone.embed_tokens if stage == 0 else None,
                norm=backbone.norm if stage == last else None,
                lm_head=model.lm_head if stage == last else None,
            )
        )
    kept = sorted(i for stage in stage_ids for i in ranges[stage])
    backbone.layers = StageLayers((i, full_layers[i]) for i in kept)
    if 0 not in stage_ids:
        backbone.embed_tokens = None
    if last not in stage_ids:
        backbone.norm = None
        model.lm_head = None
    return model, stages
