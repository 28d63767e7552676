"""Native `MixtralForCausalLM`: Mistral attention (sliding window) with a sparse MoE per layer.

Attention, norms and RoPE are the common stack's (no projection biases; `sliding_window`
windows every layer when set). Every layer's MLP is `MixtralSparseMoeBlock`: an fp32 top-k
router whose weight stays fp32 (`_keep_in_fp32_modules_strict`) and grouped experts that
expert parallelism spreads over ranks (`parallelize.py`). Weights convert through
`MixtralStateDictAdapter` (checkpoint names `block_sparse_moe.experts.{e}.w1/w2/w3`). With
`output_router_logits: true` the loss adds `router_aux_loss_coef` x the Switch
load-balancing loss, as transformers does. Tied embeddings: both (released checkpoints are
untied).
"""

from __future__ import annotations

from typing import Any

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.moe.load_balancing import RouterAuxLossMixin
from models.common.tie import reject_unsupported_tie_word_embeddings
from models.mixtral.layers import mixtral_mlp


class MixtralForCausalLM(RouterAuxLossMixin, NativeCausalLM):
    architecture = "MixtralForCausalLM"
    # Sparse layers only: FSDP, LoRA on attention, expert parallelism; no tensor-parallel
    # plan for the experts.
    _keep_in_fp32_modules_strict = ["mlp.gate"]

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DecoderModel(config, mlp_factory=mixtral_mlp))


ModelClass = MixtralForCausalLM
