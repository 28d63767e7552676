"""trainer.kd: the distillation step loss mixes CE and KD by kd_ratio; the teacher is frozen.

Named apart from tests/unit/jobs/recipe/test_kd.py: pytest imports test files by basename.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jobs.recipe.typed import TargetCall
from trainer.kd import Distillation, build_teacher
from trainer.kd_loss import KDLoss, kd_token_loss_sum
from trainer.loss import MaskedCrossEntropy, token_loss_sum


def tiny(layers: int, seed: int):
    from transformers import LlamaForCausalLM

    from cli.demo_assets import tiny_llama_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(64, num_hidden_layers=layers)).eval()


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 64, (2, 6), generator=gen)
    labels = input_ids.roll(-1, dims=1)
    labels[:, :2] = -100
    return {"input_ids": input_ids, "labels": labels}


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
def test_step_loss_is_the_ratio_mix_of_ce_and_kd(batch, ratio):
    student, teacher = tiny(1, 0), tiny(2, 1)
    run = SimpleNamespace(
        forward_model=student, env=SimpleNamespace(device=torch.device("cpu")),
        loss_fn=MaskedCrossEntropy(),
    )  # fmt: skip
    kd_fn = KDLoss(temperature=2.0)
    got = Distillation(teacher, kd_fn, ratio)(run, batch)
    with torch.no_grad():
        s_logits = student(input_ids=batch["input_ids"]).logits
        t_logits = teacher(input_ids=batch["input_ids"]).logits
    ce = token_loss_sum(run.loss_fn, s_logits, batch["labels"])
    kd = kd_token_loss_sum(kd_fn, s_logits, t_logits, batch["labels"])
    assert float(got.detach()) == pytest.approx(float((1 - ratio) * ce + ratio * kd), abs=1e-5)
    got.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None for p in student.parameters())


def test_teacher_is_frozen_in_eval_mode_on_the_device(tiny_dir):
    recipe = SimpleNamespace(
        teacher_model=TargetCall(
            "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            {"pretrained_model_name_or_path": str(tiny_dir), "dtype": "float32"},
        ),
        topology=SimpleNamespace(strategy="ddp"),
    )
    env = SimpleNamespace(device=torch.device("cpu"))
    teacher = build_teacher(recipe, env, topology=None)
    assert not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
