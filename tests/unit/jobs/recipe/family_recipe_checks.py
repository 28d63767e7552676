"""Submit-time checks the model families' recipe tests share.

`assert_hf_class_refused`: a family whose parallel claim holds only for its native class
refuses, at each field, what would load the Hugging Face class instead (`model.force_hf`,
an `attn_implementation` native does not run), and accepts `eager`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recipe_asserts import error_at


def assert_hf_class_refused(
    validate: Callable[..., Any], recipe: dict, msg: str, fix: str, attn_msg: str
) -> None:
    """`force_hf` is refused at model.force_hf (`msg` in the message, `fix` in the fix),
    flash_attention_2 at model.attn_implementation (`attn_msg`); eager validates."""
    recipe["model"]["force_hf"] = True
    error = error_at(validate(recipe, nproc_per_node=2), "model.force_hf")
    assert msg in error.msg and fix in error.fix
    recipe["model"].pop("force_hf")
    recipe["model"]["attn_implementation"] = "flash_attention_2"
    assert attn_msg in error_at(validate(recipe, nproc_per_node=2), "model.attn_implementation").msg
    recipe["model"]["attn_implementation"] = "eager"
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
