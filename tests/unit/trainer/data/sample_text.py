"""Reading a sample back as text: its target tokens and its context tokens."""

from __future__ import annotations


def targets_of(tokenizer, sample) -> str:
    """The text of a sample's target tokens (loss_mask 1), in order."""
    return tokenizer.decode(
        [i for i, m in zip(sample["input_ids"], sample["loss_mask"], strict=False) if m]
    )


def context_of(tokenizer, sample) -> str:
    return tokenizer.decode(
        [i for i, m in zip(sample["input_ids"], sample["loss_mask"], strict=False) if not m]
    )
