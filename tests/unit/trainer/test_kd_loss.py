"""trainer.kd_loss: KDLoss against a forward KL written out by hand, in plain Python."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.kd_loss import KDLoss, kd_token_loss_sum


def softmax(row: list[float], temperature: float) -> list[float]:
    scaled = [x / temperature for x in row]
    top = max(scaled)
    exps = [math.exp(x - top) for x in scaled]
    total = sum(exps)
    return [e / total for e in exps]


def reference_kd(student, teacher, labels, temperature, ignore_index=-100) -> float:
    """mean over label tokens of T^2 * sum_v p_t(v) * (log p_t(v) - log p_s(v))."""
    kls = []
    for s_row, t_row, label in zip(student, teacher, labels, strict=True):
        if label == ignore_index:
            continue
        p_s, p_t = softmax(s_row, temperature), softmax(t_row, temperature)
        kl = sum(pt * (math.log(pt) - math.log(ps)) for pt, ps in zip(p_t, p_s, strict=True))
        kls.append(kl * temperature**2)
    return sum(kls) / len(kls)


@pytest.fixture
def logits():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(2, 5, 7, generator=gen, dtype=torch.float64)
    teacher = torch.randn(2, 5, 7, generator=gen, dtype=torch.float64) * 2
    labels = torch.tensor([[3, -100, 1, 0, -100], [-100, 6, 2, -100, 5]])
    return student, teacher, labels


def _flat(student, teacher, labels):
    return (
        student.reshape(-1, student.shape[-1]).tolist(),
        teacher.reshape(-1, teacher.shape[-1]).tolist(),
        labels.reshape(-1).tolist(),
    )


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
@pytest.mark.parametrize("chunk_size", [0, 2])
def test_matches_the_hand_computed_kl(logits, temperature, chunk_size):
    student, teacher, labels = logits
    got = KDLoss(temperature=temperature, chunk_size=chunk_size)(student, teacher, labels)
    want = reference_kd(*_flat(student, teacher, labels), temperature)
    assert float(got) == pytest.approx(want, abs=1e-6)


def test_sum_reduction_and_token_sum_agree(logits):
    student, teacher, labels = logits
    count = int((labels != -100).sum())
    mean = KDLoss(temperature=2.0)(student, teacher, labels)
    total = KDLoss(temperature=2.0, reduction="sum")(student, teacher, labels)
    assert float(total) == pytest.approx(float(mean) * count, abs=1e-6)
    summed = kd_token_loss_sum(KDLoss(temperature=2.0), student, teacher, labels)
    assert float(summed) == pytest.approx(float(total), abs=1e-6)


def test_identical_distributions_cost_nothing(logits):
    student, _, labels = logits
    assert float(KDLoss()(student, student.clone(), labels)) == pytest.approx(0.0, abs=1e-9)


def test_custom_ignore_index_masks_those_tokens(logits):
    student, teacher, labels = logits
    masked = labels.masked_fill(labels == -100, 99)
    got = KDLoss(ignore_index=99)(student, teacher, masked)
    want = reference_kd(*_flat(student, teacher, masked), 1.0, ignore_index=99)
    assert float(got) == pytest.approx(want, abs=1e-6)


def test_gradient_reaches_the_student_only(logits):
    student, teacher, labels = logits
    student = student.float().requires_grad_(True)
    teacher = teacher.float().requires_grad_(True)
    KDLoss(temperature=2.0)(student, teacher, labels).backward()
    assert student.grad is not None and float(student.grad.abs().sum()) > 0
    assert teacher.grad is None
    ignored = (labels == -100).unsqueeze(-1).expand_as(student)
    assert float(student.grad[ignored].abs().sum()) == 0.0


def test_all_ignored_is_a_connected_zero(logits):
    student, teacher, _ = logits
    student = student.requires_grad_(True)
    loss = KDLoss()(student, teacher, torch.full((2, 5), -100))
    loss.backward()
    assert float(loss.detach()) == 0.0 and student.grad is not None


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"reduction": "none"}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        KDLoss(**kwargs)
