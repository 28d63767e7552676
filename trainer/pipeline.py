"""Pipeline parallelism: the model split into stages over the mesh's `pp` axis, run by a
`torch.distributed.pipelining` schedule.

`build_pipeline` splits the native model (`models.common.pipeline_split`): one stage per
pp rank for the single-stage schedules (`1f1b`, `gpipe`), `layers_per_stage`-sized
virtual stages (two per rank by default) placed round-robin for the looped ones
(`interleaved1f1b`, `loopedbfs`). Each local stage is then sharded on this pp rank's
sub-meshes in `trainer.parallelize`'s order (tensor parallel, expert parallel over the pp
rank's data-parallel x context-parallel ranks when the stage holds grouped experts,
activation checkpointing, FSDP2 per layer and the stage as root) and wrapped in a
`PipelineStage`. A MoE model's router load-balancing loss is refused: it is a function of
every MoE layer's routing at once, and no stage sees them all. The pruned model keeps this
rank's parameters under their full-model names: it is what the optimizer steps and the
checkpoint saves. A LoRA model is split through its base model; the adapters travel
inside the stages' layers.

`train_step` is the fine-tuning step under PP: each data-loader batch is one schedule
step of `local_batch_size / pp_microbatch_size` micro-batches, and the last stage's loss
is the token-summed loss scaled by `dp_size / label tokens of the whole step`, exactly the
scale the step without PP applies, so loss and gradients are the same numbers. The
gradient norm adds every stage's squares over the pp group. Schedules are built per batch
shape (the stages exchange activation shapes once per schedule), so padded batches of
varying length work; validation runs forward-only GPipe / looped-BFS schedules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from jobs.recipe.topology.pipeline import split_error, stage_count
from jobs.recipe.typed import Topology as Layout
from models import hooks
from models.common.moe.parallelize import grouped_experts
from models.common.pipeline_split import split_model, stage_layer_ranges
from trainer.distributed import Topology, all_reduce_sum
from trainer.errors import data_error, unsupported
from trainer.loss import token_loss_sum
from trainer.parallelize import (
    ExpertShards,
    apply_activation_checkpointing,
    apply_expert_parallel,
    apply_fsdp2,
    apply_tensor_parallel,
    clip_grad_norm,
    ep_spans_dp_axis,
    row_refusal,
)

if TYPE_CHECKING:
    from trainer.setup import TrainingRun

_MODEL_INPUTS = ("position_ids", "attention_mask")


class StageLoss:
    """The last stage's loss: token-summed cross entropy times the step's scale."""

    def __init__(self, loss_fn: nn.Module | None = None) -> None:
        self.loss_fn = loss_fn
        self.scale = 1.0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(self.loss_fn, logits, labels) * self.scale


@dataclass
class Pipeline:
    """This rank's stages and the schedule that runs them."""

    stages: list[nn.Module]
    stage_ids: list[int]
    num_stages: int
    schedule_name: str
    microbatch_size: int
    scale_grads: bool
    group: Any
    device: torch.device
    loss: StageLoss
    schedules: dict[tuple, Any] = field(default_factory=dict)

    @property
    def has_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def schedule_for(self, rows: int, key: tuple, train: bool) -> tuple[Any, int]:
        """The schedule for batches of this shape (built, and shapes exchanged, once)."""
        cache_key = (rows, key, train)
        if cache_key not in self.schedules:
            n_micro = rows // self.microbatch_size if train else rows
            if train and (rows % self.microbatch_size or n_micro < 1):
                raise data_error(
                    f"a training batch of {rows} rows does not split into micro-batches of "
                    f"distributed.pipeline.pp_microbatch_size {self.microbatch_size}"
                )
            name = self.schedule_name if train else _forward_only(len(self.stages))
            self.schedules[cache_key] = (self._build_schedule(name, n_micro), n_micro)
        return self.schedules[cache_key]

    def _build_schedule(self, name: str, n_micro: int) -> Any:
        stages = [
            PipelineStage(module, index, self.num_stages, self.device, group=self.group)
            for module, index in zip(self.stages, self.stage_ids, strict=True)
        ]
        cls = get_schedule_class(name)
        target = stages[0] if issubclass(cls, PipelineScheduleSingle) else stages
        return cls(target, n_microbatches=n_micro, loss_fn=self.loss, scale_grads=self.scale_grads)

    def run(self, batch: dict[str, Any], train: bool) -> float:
        """One schedule step (train) or forward pass (eval) over a batch; the last
        stage's loss summed over label tokens (0.0 elsewhere)."""
        ids = batch["input_ids"].to(self.device, non_blocking=True)
        kwargs = {k: batch[k].to(self.device) for k in _MODEL_INPUTS if k in batch}
        schedule, _ = self.schedule_for(ids.shape[0], (*ids.shape[1:], *sorted(kwargs)), train)
        args = (ids,) if self.has_first else ()
        target = batch["labels"].to(self.device) if self.has_last else None
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        if train:
            schedule.step(*args, target=target, losses=losses, return_outputs=False, **kwargs)
        else:
            schedule.eval(*args, target=target, losses=losses, **kwargs)
        return sum(float(loss.detach()) for loss in losses or []) / self.loss.scale


def _forward_only(local_stages: int) -> str:
    return "gpipe" if local_stages == 1 else "loopedbfs"


def stage_layout(
    schedule_name: str, pp_size: int, pp_rank: int, num_layers: int, config: dict[str, Any]
) -> tuple[int, list[int], list[range]]:
    """(number of stages, this rank's stage ids, each stage's layers) for the schedule;
    stages are placed round-robin (stage s on pp rank s % pp_size)."""
    reason = split_error(schedule_name, pp_size, num_layers, config)
    if reason:  # validation checked the model's config.json; its weights may differ
        raise data_error(f"distributed.pipeline: {reason}; change layers_per_stage")
    num_stages, per_stage = stage_count(schedule_name, pp_size, num_layers, config)
    ranges = stage_layer_ranges(num_layers, num_stages, per_stage)
    return num_stages, list(range(pp_rank, num_stages, pp_size)), ranges


def shard_stage(
    stage: nn.Module, plan: Any, topology: Topology, layout: Layout, device: torch.device
) -> None:
    """`trainer.parallelize`'s order on one stage: TP, expert parallelism (over this pp
    rank's data-parallel x context-parallel ranks, when the stage holds experts),
    activation checkpointing, FSDP2."""
    if topology.tp_size > 1:
        apply_tensor_parallel(stage, plan, topology, sequence_parallel=False)
    experts: ExpertShards | None = None
    kind = getattr(plan, "experts_class", None)
    if topology.ep_size > 1 and kind is not None and grouped_experts(stage, kind):
        experts = apply_expert_parallel(stage, plan, topology)
    apply_activation_checkpointing(stage, plan, layout.activation_checkpointing)
    apply_fsdp2(stage, plan, topology, layout, device, experts)


def build_pipeline(
    model: nn.Module, topology: Topology, layout: Layout, device: torch.device
) -> tuple[nn.Module, Pipeline]:
    """Split `model` into this rank's stages, shard them; (pruned model, its pipeline).

    The stage loss gets the recipe's loss function once setup has built it.
    """
    schedule = layout.pipeline
    if layout.strategy != "fsdp2" or schedule is None:
        raise unsupported("distributed.pp_size > 1 needs strategy: fsdp2")
    # A LoRA model is split through its base: the PeftModel shares the pruned modules, so
    # it keeps exactly this rank's adapters (and frozen base weights) under its own names.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    plan = hooks.parallel_plan(base)  # the family's plan, found before pruning
    refusal = row_refusal(base, layout) or _stage_refusal(base, plan, topology)
    if refusal:
        raise unsupported(refusal)
    layers = getattr(getattr(base, "model", None), "layers", None)
    if layers is None:
        raise data_error(f"model: {type(base).__name__} has no model.layers to split")
    num_stages, stage_ids, ranges = stage_layout(
        schedule.schedule, topology.pp_size, topology.pp_rank, len(layers), schedule.section
    )
    try:
        _, stages = split_model(base, stage_ids, ranges)
    except ValueError as exc:
        raise data_error(f"model: {exc}; or set distributed.pp_size: 1") from None
    model.to(device)
    for stage in stages:
        shard_stage(stage, plan, topology, layout, device)
        stage.train()
    pipeline = Pipeline(
        stages,
        stage_ids,
        num_stages,
        schedule.schedule,
        schedule.microbatch_size,
        schedule.scale_grads_in_schedule,
        topology.pp_mesh.get_group(),
        device,
        StageLoss(),
    )
    return model, pipeline


def _stage_refusal(model: nn.Module, plan: Any, topology: Topology) -> str | None:
    """What the stages cannot carry (validation refuses the same recipes): the router's
    load-balancing loss, a function of every MoE layer's routing at once, which no stage
    sees; expert parallelism outside one pp rank's data-parallel (x context) ranks."""
    if getattr(model.config, "output_router_logits", False):
        return (
            "model.output_router_logits: the load-balancing loss needs every stage's "
            "router logits; set it to false or distributed.pp_size: 1"
        )
    if topology.ep_size == 1:
        return None
    if not ep_spans_dp_axis(topology):
        return (
            f"distributed.ep_size: {topology.ep_size} must divide dp_size x cp_size "
            f"({topology.dp_size * topology.cp_size}) with tp and dp_replicate sizes 1"
        )
    reason = plan.ep_unsupported_reason(model, topology.ep_size)
    return f"distributed.ep_size: {reason}; set distributed.ep_size: 1" if reason else None


def train_step(run: TrainingRun, micro_batches: list[dict[str, Any]]) -> tuple[float, float, int]:
    """One optimizer step under PP; returns (loss, grad_norm, tokens) as without PP."""
    pipe, topology = run.pipeline, run.topology
    copies = topology.tp_size * topology.pp_size  # ranks that see the same batch
    local_labels = sum(int((b["labels"] != -100).sum()) for b in micro_batches)
    label_tokens = max(1.0, all_reduce_sum([local_labels], run.env.device)[0] / copies)
    loss_sum = 0.0
    for batch in micro_batches:
        _, n_micro = pipe.schedule_for(batch["input_ids"].shape[0], _shape_key(batch), True)
        # torch divides gradients by the micro-batch count when it scales them itself
        pipe.loss.scale = topology.dp_size / label_tokens * (n_micro if pipe.scale_grads else 1)
        loss_sum += pipe.run(batch, train=True)
    params = [p for p in run.model.parameters() if p.requires_grad]
    grad_norm = clip_stage_grad_norm(params, run.recipe.clip_grad_norm.max_norm, pipe.group)
    run.optimizer.step()
    if run.scheduler is not None:
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = sum(b["num_tokens"] for b in micro_batches)
    total_loss, total_tokens = all_reduce_sum([loss_sum, tokens], run.env.device)
    return total_loss / topology.tp_size / label_tokens, grad_norm, int(total_tokens / copies)


def clip_stage_grad_norm(
    parameters: list[nn.Parameter], max_norm: float | None, group: Any
) -> float:
    """The gradient norm over every stage (squares summed over the pp group), clipped."""
    local = clip_grad_norm(parameters, None)  # this rank's stages, not clipped yet
    device = parameters[0].device if parameters else torch.device("cpu")
    squares = torch.tensor([local**2], dtype=torch.float64, device=device)
    dist.all_reduce(squares, group=group)
    total = float(squares.item()) ** 0.5
    if max_norm is not None and max_norm > 0 and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for param in parameters:
            if param.grad is not None:
                param.grad.mul_(scale)
    return total


def _shape_key(batch: dict[str, Any]) -> tuple:
    return (*batch["input_ids"].shape[1:], *sorted(k for k in _MODEL_INPUTS if k in batch))


@torch.no_grad()
def validate(run: TrainingRun) -> tuple[float, int]:
    """Validation loss per label token and tokens seen, forward only through the stages."""
    pipe, topology = run.pipeline, run.topology
    for stage in pipe.stages:
        stage.train(False)
    pipe.loss.scale = 1.0
    loss_sum, labels, tokens = 0.0, 0, 0
    for batch in run.val_loader:
        loss_sum += pipe.run(batch, train=False)
        labels += int((batch["labels"] != -100).sum())
        tokens += batch["num_tokens"]
    for stage in pipe.stages:
        stage.train(True)
    copies = topology.tp_size * topology.pp_size
    loss_sum, labels, tokens = all_reduce_sum([loss_sum, labels, tokens], run.env.device)
    return loss_sum / topology.tp_size / max(1.0, labels / copies), int(tokens / copies)
