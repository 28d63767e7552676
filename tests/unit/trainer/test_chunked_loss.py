"""The chunked, fused-linear and TE cross entropies equal the masked cross entropy
(trainer.chunked_loss)."""

from __future__ import annotations

import pytest
import torch

from trainer.chunked_loss import (
    ChunkedCrossEntropy,
    FusedLinearCrossEntropy,
    TEParallelCrossEntropy,
)
from trainer.loss import MaskedCrossEntropy, token_loss_sum


def _batch(dtype=torch.float32):
    torch.manual_seed(0)
    logits = torch.randn(3, 11, 37, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 37, (3, 11))
    labels[:, :4] = -100
    return logits, labels


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("chunk_len", [1, 5, 64])
def test_value_and_gradient_match_the_masked_cross_entropy(reduction, chunk_len):
    logits, labels = _batch()
    ours = ChunkedCrossEntropy(chunk_len=chunk_len, reduction=reduction)(logits, labels)
    (g_ours,) = torch.autograd.grad(ours, logits)
    ref = MaskedCrossEntropy(reduction=reduction)(logits, labels)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(g_ours, g_ref, atol=1e-6)


def test_bf16_logits_get_a_bf16_gradient_close_to_fp32():
    logits, labels = _batch(torch.bfloat16)
    loss = ChunkedCrossEntropy(chunk_len=4)(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad.dtype == torch.bfloat16
    ref = MaskedCrossEntropy(reduction="sum")(logits.float(), labels)
    assert abs(float(loss) - float(ref)) < 1e-3 * float(ref)


def test_no_label_tokens_gives_zero_loss_and_zero_gradient():
    logits, labels = _batch()
    labels[:] = -100
    loss = ChunkedCrossEntropy(reduction="mean")(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    assert float(loss) == 0.0 and float(grad.abs().sum()) == 0.0


def test_the_step_loop_sum_is_the_same_for_each_loss():
    logits, labels = _batch()
    ref = token_loss_sum(MaskedCrossEntropy(), logits, labels)
    for loss_fn in (ChunkedCrossEntropy(), FusedLinearCrossEntropy(), TEParallelCrossEntropy(),
                    ChunkedCrossEntropy(reduction="mean")):  # fmt: skip
        assert torch.allclose(token_loss_sum(loss_fn, logits, labels), ref, atol=1e-4)


def test_logit_softcapping_caps_before_the_cross_entropy():
    logits, labels = _batch()
    capped = FusedLinearCrossEntropy(logit_softcapping=2.0)(logits * 10, labels)
    ref = MaskedCrossEntropy(reduction="sum")(torch.tanh(logits * 10 / 2.0) * 2.0, labels)
    assert torch.allclose(capped, ref, atol=1e-4)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: ChunkedCrossEntropy(chunk_len=0), "chunk_len"),
        (lambda: ChunkedCrossEntropy(reduction="none"), "reduction"),
        (lambda: FusedLinearCrossEntropy(logit_softcapping=-1.0), "logit_softcapping"),
    ],
)
def test_bad_arguments_are_value_errors(make, why):
    with pytest.raises(ValueError, match=why):
        make()
