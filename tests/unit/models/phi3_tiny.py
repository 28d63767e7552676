"""Tiny seeded Phi-3 configs for the Phi-3 tests (fp32, ~60k parameters).

`phi3_config(variant)` builds one of: "plain" (full rotary, no window), "partial"
(`partial_rotary_factor` 0.5), "longrope" (short/long factors, original length 32 of 256),
"window" (`sliding_window` 8), "phi4mini" (longrope + partial rotary + tied, as
Phi-4-mini is). Keyword overrides go to `transformers.Phi3Config`.
"""

from __future__ import annotations

from typing import Any

VOCAB = 128
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
ORIGINAL = 32  # longrope's original_max_position_embeddings
VARIANTS = ["plain", "partial", "longrope", "window", "phi4mini"]


def longrope(pairs: int) -> dict[str, Any]:
    """LongRoPE parameters with distinct short and long per-dimension factors."""
    return {
        "type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(pairs)],
        "long_factor": [1.5 + 0.4 * i for i in range(pairs)],
    }


def phi3_config(variant: str = "plain", **overrides: Any):
    import transformers

    kwargs: dict[str, Any] = dict(COMMON)
    if variant == "partial":
        kwargs["partial_rotary_factor"] = 0.5
    if variant in ("longrope", "phi4mini"):
        partial = 0.75 if variant == "phi4mini" else 1.0
        kwargs["partial_rotary_factor"] = partial
        kwargs["rope_scaling"] = longrope(int(16 * partial) // 2)
        kwargs["original_max_position_embeddings"] = ORIGINAL
    if variant == "phi4mini":
        kwargs["tie_word_embeddings"] = True
    if variant == "window":
        kwargs["sliding_window"] = 8
    return transformers.Phi3Config(**{**kwargs, **overrides})
