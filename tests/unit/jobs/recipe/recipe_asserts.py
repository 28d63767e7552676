"""Shared helpers for the recipe validation tests: a tiny Llama config and error lookups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.validation import ValidationResult

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
# What transformers' LlamaForCausalLM(TINY_LLAMA_CONFIG) reports as its parameter count.
TINY_LLAMA_PARAMS = 139_584


def write_model_dir(directory: Path, config: dict[str, Any] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or TINY_LLAMA_CONFIG))
    return directory


def locs(result: ValidationResult) -> list[str]:
    return [e.loc for e in result.errors]


def error_at(result: ValidationResult, loc: str) -> FieldError:
    """The one error at `loc` (fails listing all errors when there is none)."""
    found = [e for e in result.errors if e.loc == loc]
    assert found, f"no error at {loc}; errors: {[str(e) for e in result.errors]}"
    return found[0]
