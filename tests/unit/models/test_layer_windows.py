"""Sliding windows per layer from a config.json dict equal what transformers derives when it
builds the config (Gemma 2, Gemma 3, gpt-oss, Qwen2, Mistral), and the attention FLOPs of
a windowed layer count its window of keys, not the whole sequence."""

from __future__ import annotations

import pytest

from jobs.recipe.plan.flops import _attention_flops, flops_breakdown
from jobs.recipe.plan.windows import layer_sliding_window

CASES = [
    ("Gemma2Config", {"model_type": "gemma2", "num_hidden_layers": 7, "sliding_window": 512}),
    ("Gemma3TextConfig", {"model_type": "gemma3_text", "num_hidden_layers": 13,
                          "sliding_window": 256}),
    ("Gemma3TextConfig", {"model_type": "gemma3_text", "num_hidden_layers": 9,
                          "sliding_window": 256, "sliding_window_pattern": 3}),
    ("GptOssConfig", {"model_type": "gpt_oss", "num_hidden_layers": 5, "sliding_window": 128}),
    ("Qwen2Config", {"model_type": "qwen2", "num_hidden_layers": 6, "sliding_window": 4096,
                     "use_sliding_window": True, "max_window_layers": 4}),
    ("Qwen2Config", {"model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 4096,
                     "use_sliding_window": False}),
    ("MistralConfig", {"model_type": "mistral", "num_hidden_layers": 3, "sliding_window": 4096}),
    ("MistralConfig", {"model_type": "mistral", "num_hidden_layers": 3, "sliding_window": None}),
    ("LlamaConfig", {"model_type": "llama", "num_hidden_layers": 3}),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "raw"), CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_a_config_json_windows_the_layers_transformers_would(cls: str, raw: dict) -> None:
    import transformers

    built = getattr(transformers, cls)(**{k: v for k, v in raw.items() if k != "model_type"})
    layers = raw["num_hidden_layers"]
    from_dict = [layer_sliding_window(raw, i) for i in range(layers)]
    from_object = [layer_sliding_window(built, i) for i in range(layers)]
    window = getattr(built, "sliding_window", None)
    kinds = getattr(built, "layer_types", None) or ["sliding_attention"] * layers
    expected = [window if kind == "sliding_attention" and window else None for kind in kinds]
    assert from_dict == from_object == expected


def test_windowed_layers_count_their_window_of_keys() -> None:
    base = {"model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 8,
            "hidden_size": 512, "head_dim": 64}  # fmt: skip
    full = _attention_flops({**base, "sliding_window": None}, 4096)
    windowed = _attention_flops({**base, "sliding_window": 128}, 4096)
    per_key_layer = 2 * 8 * (64 + 64)
    assert full == per_key_layer * 4 * 4096
    assert windowed == per_key_layer * (128 + 4096 + 128 + 4096)  # layers 0 and 2 windowed
    short = _attention_flops({**base, "sliding_window": 128}, 64)  # shorter than the window
    assert short == per_key_layer * 4 * 64
    dense = {**base, "model_type": "llama", "intermediate_size": 1024, "vocab_size": 1000,
             "num_key_value_heads": 8}  # fmt: skip
    assert flops_breakdown({**dense, "sliding_window": 128, "model_type": "mistral"},
                           4096).attention == 3 * per_key_layer * 4 * 128  # fmt: skip
