"""Losses: masked cross entropy ignores masked tokens; token_loss_sum sums for any reduction."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from trainer.loss import MaskedCrossEntropy, token_loss_sum


def test_masked_cross_entropy_ignores_masked_tokens() -> None:
    logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    labels[0, :2] = -100
    keep = labels != -100
    expected = F.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(MaskedCrossEntropy()(logits, labels), expected)
    summed = MaskedCrossEntropy(reduction="sum")(logits, labels)
    torch.testing.assert_close(summed, expected * keep.sum())


def test_token_loss_sum_is_a_sum_for_any_reduction() -> None:
    logits, labels = torch.randn(1, 6, 7), torch.randint(0, 7, (1, 6))
    labels[0, 0] = -100
    a = token_loss_sum(torch.nn.CrossEntropyLoss(), logits, labels)
    b = token_loss_sum(MaskedCrossEntropy(reduction="sum"), logits, labels)
    torch.testing.assert_close(a, b)
    assert float(token_loss_sum(MaskedCrossEntropy(), logits, torch.full((1, 6), -100))) == 0.0
