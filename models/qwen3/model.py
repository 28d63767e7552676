"""Native `Qwen3ForCausalLM`: the Llama stack with per-head RMSNorm on q and k before RoPE.

`head_dim` is explicit in Qwen3 configs (128, not hidden/heads). Sliding-window layers
(`use_sliding_window`) run natively with masked SDPA. Tied embeddings: both
(Qwen3 0.6B-4B are tied, 8B and up untied).
"""

from __future__ import annotations

from typing import Any

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.tie import reject_unsupported_tie_word_embeddings


class Qwen3ForCausalLM(NativeCausalLM):
    architecture = "Qwen3ForCausalLM"

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DecoderModel(config, qk_norm=True))


ModelClass = Qwen3ForCausalLM
