"""Native `MistralForCausalLM`: the Llama stack with sliding-window attention on every layer.

Mistral's decoder is Llama's without any projection bias (its config has no
`attention_bias`/`mlp_bias`), with an explicit `head_dim` and, when `sliding_window` is set,
every layer's query i attending only to keys i-w+1..i (`layer_sliding_window` and
`build_attention_mask` in `models.common.layers`). Names and layouts equal the Hugging Face
checkpoint's, so no state-dict adapter is needed and the common dense parallel plan applies.
Tied embeddings: both (released checkpoints are untied; tiny tied configs run as well).
"""

from __future__ import annotations

from typing import Any

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.tie import reject_unsupported_tie_word_embeddings


class MistralForCausalLM(NativeCausalLM):
    architecture = "MistralForCausalLM"

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DecoderModel(config))


ModelClass = MistralForCausalLM
