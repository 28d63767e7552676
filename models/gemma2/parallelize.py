"""Gemma 2's parallel plan: the common dense plan plus the sandwich norms.

Each Gemma block normalises the attention output (`post_attention_layernorm`) and the MLP's
input and output (`pre_feedforward_layernorm`, `post_feedforward_layernorm`) besides the
input norm. Under sequence parallelism the activations between blocks are sharded on the
sequence dimension, so these extra norms run as `SequenceParallel` too: their weights are
replicated DTensors whose gradients are summed over the tensor-parallel ranks. Without
sequence parallelism they see replicated activations and stay plain modules. The embedding
scale lives inside `embed_tokens` and the final soft-cap after `lm_head`, so the common
input/output plan (tied embeddings stay replicated) is unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from models.common.parallelize import ParallelPlan

_SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


class Gemma2ParallelPlan(ParallelPlan):
    """Dense plan whose sequence-parallel blocks also shard the feed-forward norms."""

    def tp_plan(self, model: nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
        from torch.distributed.tensor.parallel import SequenceParallel

        plan = super().tp_plan(model, sequence_parallel)
        if sequence_parallel:
            layer = self.layer_pattern(model)
            for name in _SANDWICH_NORMS:
                plan[f"{layer}.{name}"] = SequenceParallel(use_local_output=False)
        return plan


GEMMA2_PLAN = Gemma2ParallelPlan()
