"""Knowledge distillation (`recipe: llm_kd`): a frozen teacher and the CE/KD mix of a step.

The KD recipe is the fine-tuning loop of `trainer.finetune` with one hook: `attach_teacher`
builds the teacher from `recipe.teacher_model` (through the same allowlist as the student),
freezes it (no gradients, eval mode, so dropout is off), shards it like the student when
the strategy is FSDP2 (same data-parallel mesh, no activation checkpointing: it never runs
a backward) or else places it on the device, and sets `run.step_loss` to `Distillation`.
Each micro-batch's loss is then `(1 - kd_ratio) * CE + kd_ratio * KD`, summed over label
tokens; the step loop normalises it as it does cross entropy, so the logged `loss` is the
combined loss. Validation keeps measuring the student's cross entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from jobs.recipe.typed import Recipe
from trainer import builders
from trainer.distributed import DistEnv, Topology
from trainer.errors import data_error
from trainer.forward import forward_logits, model_logits
from trainer.kd_loss import kd_token_loss_sum
from trainer.loss import token_loss_sum
from trainer.parallelize import parallelize
from trainer.setup import TrainingRun


@dataclass
class Distillation:
    """The micro-batch loss of a KD step, summed over label tokens."""

    teacher: nn.Module
    kd_fn: nn.Module
    kd_ratio: float

    def __call__(self, run: TrainingRun, batch: dict[str, Any]) -> torch.Tensor:
        labels = batch["labels"].to(run.env.device)
        student = forward_logits(run, batch)
        with torch.no_grad():
            teacher = model_logits(self.teacher, batch, run.env.device)
        ce = token_loss_sum(run.loss_fn, student, labels)
        kd = kd_token_loss_sum(self.kd_fn, student, teacher, labels)
        return (1.0 - self.kd_ratio) * ce + self.kd_ratio * kd


def vocab_size(model: nn.Module) -> int:
    return int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)


def build_teacher(recipe: Recipe, env: DistEnv, topology: Topology) -> nn.Module:
    """The frozen teacher, sharded like the student under FSDP2, else on the device."""
    assert recipe.teacher_model is not None  # validation requires it for llm_kd
    teacher = builders.build_model(recipe.teacher_model, "teacher_model")
    teacher.requires_grad_(False)
    if recipe.topology.strategy == "fsdp2":
        layout = recipe.topology.without_activation_checkpointing()
        parallelize(teacher, topology, layout, env.device, None)
    else:  # DDP would refuse a module with nothing to train; a replica per rank is the same
        teacher.to(env.device)
    return teacher.eval()


def attach_teacher(run: TrainingRun) -> None:
    """Make `run` a distillation run: the teacher is built and every step mixes CE and KD."""
    recipe = run.recipe
    teacher = build_teacher(recipe, run.env, run.topology)
    student_vocab, teacher_vocab = vocab_size(run.model), vocab_size(teacher)
    if student_vocab and teacher_vocab and student_vocab != teacher_vocab:
        raise data_error(
            f"teacher_model: the teacher's vocab_size is {teacher_vocab} but the student's is "
            f"{student_vocab}; distillation needs one vocabulary: use a teacher with the "
            "student's tokenizer"
        )
    assert recipe.kd_loss_fn is not None and recipe.kd_ratio is not None
    kd_fn = builders.build_target(recipe.kd_loss_fn, "kd_loss_fn")
    run.step_loss = Distillation(teacher, kd_fn, recipe.kd_ratio)
