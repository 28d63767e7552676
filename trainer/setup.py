"""Setup of a fine-tuning run: every component, built and restored in one fixed order.

`setup_run` takes the typed recipe as validation built it (nothing is re-derived here:
batch sizes, gradient accumulation and the mesh come from it) and builds the tokenizer and
model, then applies infrastructure in this order: PEFT (which freezes the base model),
load/restore of checkpointed weights (after PEFT, so a LoRA checkpoint finds its adapter
modules; before sharding, so whole tensors load into plain modules), sharding and device
placement (`trainer.parallelize`), `torch.compile` (last, so it traces the sharded
modules). Under FSDP2 without PEFT a native `from_pretrained` model (and a resume of it)
takes the shard-only path instead: built on `meta`, sharded, then filled one checkpoint
tensor at a time with each rank keeping its shard (`models.common.shard_load`;
`TUNEYARD_FULL_MODEL_LOAD=1` forces the old path). Under pipeline parallelism the whole
model is built and restored, then split into this rank's stages, each sharded on its own
(`trainer.pipeline`). Context parallelism is part of sharding (`trainer.parallelize`
sets the native attention layers to attend over the `cp` axis). fp8/QAT never reach here:
validation refuses them. Then the data loaders, optimizer, LR scheduler and loss, and the optimizer, scheduler, data
position and RNG of the checkpoint being resumed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from jobs.recipe.targets import allowlist as targets
from jobs.recipe.typed import Checkpoint as CheckpointSpec
from jobs.recipe.typed import Recipe, StepScheduler
from models.common import shard_load
from models.common.safetensors_io import CheckpointError
from trainer import builders
from trainer.checkpoint import consolidate, manager
from trainer.data.collate import Collator
from trainer.distributed import DistEnv, Topology, build_mesh, check_launch
from trainer.embedding_repair import repair_embedding_rows
from trainer.errors import checkpoint_error, data_error
from trainer.hub_models import pin_hub_models
from trainer.neftune import attach_neftune
from trainer.parallelize import parallelize
from trainer.pipeline import build_pipeline
from trainer.qlora import quantize_model
from trainer.train_state import recipe_hash, restore_rng, seed_everything

FULL_LOAD_ENV = "TUNEYARD_FULL_MODEL_LOAD"  # "1": every rank loads the whole model first


@dataclass
class TrainingRun:
    recipe: Recipe
    env: DistEnv
    topology: Topology
    tokenizer: Any
    model: nn.Module  # the sharded module whose state is saved
    forward_model: nn.Module  # what the step calls (DDP- or compile-wrapped)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loss_fn: nn.Module
    train_loader: DataLoader
    val_loader: DataLoader | None
    checkpoints: manager.CheckpointManager
    max_steps: int
    grad_accumulation_steps: int
    is_peft: bool
    architecture: str
    step: int = 0
    resumed_from: Path | None = None
    recipe_changed: bool = False
    data_state: dict[str, int] = field(default_factory=lambda: {"epoch": 0, "batches_done": 0})
    # A recipe's own micro-batch loss (summed over label tokens); None: cross entropy.
    step_loss: Callable[[TrainingRun, dict[str, Any]], torch.Tensor] | None = None
    # pp_size > 1: this rank's stages and schedule (`trainer.pipeline`); `model` is then
    # the model pruned to those stages
    pipeline: Any = None
    # micro-batch positions (epoch, batch number) a divergence rollback skips
    # (`trainer.resilience.recovery`); kept in every later checkpoint
    skipped_batches: set[tuple[int, int]] = field(default_factory=set)


def architecture_of(model: nn.Module) -> str:
    names = getattr(getattr(model, "config", None), "architectures", None) or []
    return names[0] if names else type(model).__name__


def _check_checkpoint(model: nn.Module, ckpt: Path, is_peft: bool) -> None:
    state = manager.read_trainer_state(ckpt)
    wanted, found = architecture_of(model), state.get("architecture")
    if found and found != wanted:
        raise checkpoint_error(
            f"{ckpt} holds a {found} checkpoint but the recipe's model is "
            f"{wanted}; point restore_from at a {wanted} checkpoint or "
            "use a fresh run dir"
        )
    if bool(state.get("peft")) != is_peft:
        kind = "a LoRA adapter" if state.get("peft") else "full weights"
        raise checkpoint_error(f"{ckpt} holds {kind}; the recipe's peft setting differs")


def _restore_weights(model: nn.Module, ckpt: Path, is_peft: bool) -> None:
    _check_checkpoint(model, ckpt, is_peft)
    if is_peft:
        consolidate.load_lora_adapter(model, ckpt / "model")
    else:
        consolidate.load_model_weights(model, ckpt / "model")


def _loaders(
    recipe: Recipe, tokenizer: Any, topology: Topology
) -> tuple[DataLoader, DataLoader | None]:
    packed = recipe.packed_sequence
    train_ds = builders.build_dataset(recipe.dataset, "dataset", packed, tokenizer)
    val_ds = builders.build_dataset(
        recipe.validation_dataset, "validation_dataset", packed, tokenizer
    )
    pad_id = tokenizer.pad_token_id if tokenizer is not None else 0
    sp = recipe.topology.sequence_parallel
    collator = Collator(
        pad_id, packed=packed.enabled, pad_to_multiple_of=topology.tp_size if sp else 1
    )
    common = dict(
        seed=recipe.rng.seed, dp_rank=topology.dp_rank, dp_size=topology.dp_size, collator=collator
    )
    train = builders.build_loader(train_ds, recipe.dataloader, train=True, **common)
    val = None
    if val_ds is not None:
        val = builders.build_loader(val_ds, recipe.validation_dataloader, train=False, **common)
    return train, val


def steps_to_run(schedule: StepScheduler, loader: DataLoader) -> int:
    """max_steps on its own; an explicit num_epochs also bounds it (validation's rule)."""
    per_epoch = max(1, len(loader.batch_sampler) // schedule.grad_accumulation_steps)
    if schedule.max_steps is None:
        return per_epoch * int(schedule.num_epochs or 1)
    if schedule.num_epochs is None:
        return schedule.max_steps
    return min(schedule.max_steps, per_epoch * schedule.num_epochs)


@dataclass
class ModelStack:
    tokenizer: Any
    model: nn.Module
    forward_model: nn.Module
    is_peft: bool
    architecture: str
    pipeline: Any = None


def _meta_model(recipe: Recipe) -> tuple[nn.Module, Path] | None:
    """The shard-only load's meta model and checkpoint dir, when this run can take it:
    FSDP2, no PEFT, a native `from_pretrained` whose family supports it (see
    `models.common.shard_load`); `TUNEYARD_FULL_MODEL_LOAD=1` forces the full load."""
    if os.environ.get(FULL_LOAD_ENV) == "1" or recipe.peft is not None:
        return None
    if recipe.topology.pp_size > 1:  # stages are split from the whole model
        return None
    if recipe.embedding_row_repair is not None:  # repaired on the whole tensors, then sharded
        return None
    if recipe.topology.strategy != "fsdp2":
        return None
    if targets.resolve_target(recipe.model.target, "model").import_path != (
        shard_load.FROM_PRETRAINED_IMPORT
    ):
        return None  # from_config, or another loader: today's path
    try:
        return shard_load.build_meta_native(**recipe.model.kwargs)
    except (ValueError, OSError) as exc:
        raise data_error(f"model: {exc}") from None


def _shard_only_stack(
    recipe: Recipe, env: DistEnv, topology: Topology, ckpt: Path | None, meta: tuple
) -> ModelStack:
    """Meta model -> parallelize -> each rank reads only its shards (of ckpt when resuming)."""
    tokenizer = builders.load_tokenizer(recipe)
    model, directory = meta
    builders.check_vocab(tokenizer, model)
    architecture = architecture_of(model)
    if ckpt is not None:
        _check_checkpoint(model, ckpt, is_peft=False)
        directory = ckpt / "model"
    forward_model = parallelize(model, topology, recipe.topology, env.device, recipe.compile)
    try:
        shard_load.fill_sharded(model, directory, env.device)
    except CheckpointError as exc:
        raise (checkpoint_error if ckpt is not None else data_error)(str(exc)) from None
    forward_model.train()
    return ModelStack(tokenizer, model, forward_model, False, architecture)


def build_model_stack(
    recipe: Recipe, env: DistEnv, topology: Topology, ckpt: Path | None
) -> ModelStack:
    """Tokenizer and model, then the infrastructure in the module docstring's order."""
    meta = _meta_model(recipe)
    if meta is not None:
        return _shard_only_stack(recipe, env, topology, ckpt, meta)
    tokenizer = builders.load_tokenizer(recipe)
    model = builders.build_model(recipe.model)
    builders.check_vocab(tokenizer, model)
    repair_embedding_rows(model, recipe.embedding_row_repair, env.is_rank0)  # the base load
    architecture = architecture_of(model)
    if recipe.quantization is not None:  # QLoRA: bitsandbytes' layers, before PEFT wraps them
        quantize_model(model, recipe.quantization, env.device)
    model = builders.apply_peft(model, recipe.peft)  # PEFT freezes the base model
    is_peft = recipe.peft is not None
    if ckpt is not None:
        _restore_weights(model, ckpt, is_peft)
    if topology.pp_size > 1:  # split into this rank's stages, then shard each
        model, stages = build_pipeline(model, topology, recipe.topology, env.device)
        return ModelStack(tokenizer, model, model, is_peft, architecture, stages)
    # sharding, device, compile
    forward_model = parallelize(model, topology, recipe.topology, env.device, recipe.compile)
    forward_model.train()  # from_pretrained returns eval mode: dropout would stay off
    return ModelStack(tokenizer, model, forward_model, is_peft, architecture)


def setup_run(
    recipe: Recipe,
    run_dir: Path,
    env: DistEnv,
    checkpoints: manager.CheckpointManager | None = None,
) -> TrainingRun:
    """Everything one run trains with. `checkpoints`: the manager to keep (a rollback
    rebuilds the run around the same one: its background publisher and gloo group)."""
    recipe = pin_hub_models(recipe, env.local_rank)  # hub names at the validated commit
    seed = recipe.rng.seed  # the data order uses the shared seed on every rank
    seed_everything(seed + env.rank if recipe.rng.ranked else seed)
    check_launch(env, recipe.topology)
    topology = build_mesh(env, recipe.topology)
    checkpoints = checkpoints or _checkpoint_manager(recipe.checkpoint, run_dir, env)
    checkpoints.remove_stale_staging()
    ckpt = checkpoints.resolve(recipe.restore_from.path if recipe.restore_from else None)
    stack = build_model_stack(recipe, env, topology, ckpt)
    attach_neftune(stack.model, recipe.neftune)  # before the first (compiled) forward

    train_loader, val_loader = _loaders(recipe, stack.tokenizer, topology)
    max_steps = steps_to_run(recipe.step_scheduler, train_loader)
    optimizer = builders.build_optimizer(recipe.optimizer, stack.model)
    run = TrainingRun(
        recipe=recipe,
        env=env,
        topology=topology,
        tokenizer=stack.tokenizer,
        model=stack.model,
        forward_model=stack.forward_model,
        optimizer=optimizer,
        scheduler=builders.build_lr_scheduler(recipe.lr_scheduler, optimizer, max_steps),
        loss_fn=builders.build_loss(recipe.loss_fn),
        train_loader=train_loader,
        val_loader=val_loader,
        checkpoints=checkpoints,
        max_steps=max_steps,
        grad_accumulation_steps=recipe.step_scheduler.grad_accumulation_steps,
        is_peft=stack.is_peft,
        architecture=stack.architecture,
        pipeline=stack.pipeline,
    )
    if run.pipeline is not None:
        run.pipeline.loss.loss_fn = run.loss_fn
    if ckpt is not None:
        _restore_training_state(run, ckpt)
    return run


def _checkpoint_manager(
    section: CheckpointSpec, run_dir: Path, env: DistEnv
) -> manager.CheckpointManager:
    # A relative checkpoint_dir (the server keeps it relative) lies in the run directory.
    root = run_dir / section.checkpoint_dir if section.checkpoint_dir else None
    return manager.CheckpointManager(
        run_dir,
        env.is_rank0,
        section.keep_last,
        root,
        save_optimizer=section.save_optimizer,
        is_async=section.is_async,
        keep_best=section.keep_best,
    )


def _restore_training_state(run: TrainingRun, ckpt: Path) -> None:
    state = manager.read_trainer_state(ckpt)
    if (ckpt / "optim" / ".metadata").is_file():
        manager.load_optimizer(run.model, run.optimizer, run.scheduler, ckpt / "optim")
    else:
        print(
            f"note: {ckpt} has no optimizer state (checkpoint.save_optimizer was false); "
            "the optimizer starts fresh",
            flush=True,
        )
    run.step = int(state["step"])
    run.data_state = _data_position(state, run.topology.dp_size)
    rng = state.get("rng") or []
    if run.env.rank < len(rng):
        restore_rng(rng[run.env.rank])
    run.skipped_batches = {(int(e), int(n)) for e, n in state.get("skipped_batches") or []}
    run.resumed_from = ckpt
    run.recipe_changed = state.get("recipe_hash") != recipe_hash(run.recipe.to_json())


def _data_position(state: dict[str, Any], dp_size: int) -> dict[str, int]:
    """The saved (epoch, batches_done), rescaled when the data-parallel size changed."""
    position = {k: int(v) for k, v in state["data"].items()}
    saved_dp = int(state.get("dp_size") or dp_size)
    if saved_dp != dp_size:  # same samples consumed, counted in the new batch grid
        position["batches_done"] = position["batches_done"] * saved_dp // dp_size
        print(
            f"note: dp size changed {saved_dp} -> {dp_size}; data order differs from "
            "the interrupted run",
            flush=True,
        )
    return position
