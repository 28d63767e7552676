"""Setup of a fine-tuning run: every component, built and restored in one fixed order.

`setup_run` builds the tokenizer and model, then applies infrastructure in this order:
PEFT (which freezes the base model), fp8/QAT (refused where unavailable), load/restore of
checkpointed weights (after PEFT, so a LoRA checkpoint finds its adapter modules; before
sharding, so whole tensors load into plain modules), sharding and device placement
(`trainer.parallelize`), `torch.compile` (last, so it traces the sharded modules);
context-parallel hooks are not needed because `cp_size > 1` is refused. Then the data
loaders, optimizer, LR scheduler and loss, and the optimizer, scheduler, data position and
RNG of the checkpoint being resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import builders
from trainer.checkpoint import consolidate, manager
from trainer.data.collate import Collator
from trainer.distributed import DistEnv, Topology, build_mesh
from trainer.errors import checkpoint_error, unsupported
from trainer.parallelize import parallelize
from trainer.train_state import recipe_hash, restore_rng, seed_everything


@dataclass
class TrainingRun:
    recipe: dict[str, Any]
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


def architecture_of(model: nn.Module) -> str:
    names = getattr(getattr(model, "config", None), "architectures", None) or []
    return names[0] if names else type(model).__name__


def _micro_batch_size(recipe: dict[str, Any]) -> int:
    step = recipe.get("step_scheduler") or {}
    return int(
        (recipe.get("dataloader") or {}).get("batch_size") or step.get("local_batch_size") or 1
    )


def _grad_accumulation(recipe: dict[str, Any], micro: int, dp_size: int) -> int:
    step = recipe.get("step_scheduler") or {}
    if step.get("grad_accumulation_steps"):
        return int(step["grad_accumulation_steps"])
    if step.get("global_batch_size"):
        return max(1, int(step["global_batch_size"]) // (micro * dp_size))
    return 1


def _restore_weights(model: nn.Module, ckpt: Path, is_peft: bool) -> None:
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
    if is_peft:
        consolidate.load_lora_adapter(model, ckpt / "model")
    else:
        consolidate.load_model_weights(model, ckpt / "model")


def _loaders(recipe, tokenizer, topology, micro, seed) -> tuple[DataLoader, DataLoader | None]:
    train_ds = builders.build_dataset(recipe, "dataset", tokenizer)
    val_ds = builders.build_dataset(recipe, "validation_dataset", tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer is not None else 0
    packed = bool(builders.packing(recipe, recipe.get("dataset") or {}))
    sp = bool((recipe.get("distributed") or {}).get("sequence_parallel"))
    collator = Collator(pad_id, packed=packed, pad_to_multiple_of=topology.tp_size if sp else 1)
    common = dict(seed=seed, dp_rank=topology.dp_rank, dp_size=topology.dp_size, collator=collator)
    train = builders.build_loader(
        train_ds, recipe.get("dataloader") or {}, micro, train=True, **common
    )
    val = None
    if val_ds is not None:
        section = recipe.get("validation_dataloader") or {}
        val = builders.build_loader(
            val_ds, section, int(section.get("batch_size") or micro), train=False, **common
        )
    return train, val


def _max_steps(recipe: dict[str, Any], loader: DataLoader, grad_acc: int) -> int:
    step = recipe.get("step_scheduler") or {}
    per_epoch = max(1, len(loader.batch_sampler) // grad_acc)
    by_epochs = per_epoch * int(step.get("num_epochs") or 1)
    return min(int(step["max_steps"]), by_epochs) if step.get("max_steps") else by_epochs


@dataclass
class ModelStack:
    tokenizer: Any
    model: nn.Module
    forward_model: nn.Module
    is_peft: bool
    architecture: str


def build_model_stack(
    recipe: dict[str, Any], env: DistEnv, topology: Topology, ckpt: Path | None
) -> ModelStack:
    """Tokenizer and model, then the infrastructure in the module docstring's order."""
    tokenizer = builders.load_tokenizer(recipe)
    model = builders.build_model(recipe)
    builders.check_vocab(tokenizer, model)
    architecture = architecture_of(model)
    check_peft_parallelism(recipe)
    model = builders.apply_peft(model, recipe.get("peft"))  # PEFT freezes the base model
    is_peft = recipe.get("peft") is not None
    builders.refuse_quantization(recipe, env.device)
    if ckpt is not None:
        _restore_weights(model, ckpt, is_peft)
    distributed = recipe.get("distributed") or {}  # sharding, device, compile
    forward_model = parallelize(model, topology, distributed, env.device, recipe.get("compile"))
    forward_model.train()  # from_pretrained returns eval mode: dropout would stay off
    return ModelStack(tokenizer, model, forward_model, is_peft, architecture)


def setup_run(recipe: dict[str, Any], run_dir: Path, env: DistEnv) -> TrainingRun:
    rng = recipe.get("rng") or {}
    seed = int(rng.get("seed", 42))  # the data order uses the shared seed on every rank
    seed_everything(seed + env.rank if rng.get("ranked") else seed)
    topology = build_mesh(env, recipe.get("distributed") or {})
    checkpoints = _checkpoint_manager(recipe, run_dir, env)
    checkpoints.remove_stale_staging()
    ckpt = checkpoints.resolve(_restore_from(recipe))
    stack = build_model_stack(recipe, env, topology, ckpt)

    micro = _micro_batch_size(recipe)
    grad_acc = _grad_accumulation(recipe, micro, topology.dp_size)
    train_loader, val_loader = _loaders(recipe, stack.tokenizer, topology, micro, seed)
    max_steps = _max_steps(recipe, train_loader, grad_acc)
    optimizer = builders.build_optimizer(recipe, stack.model)
    run = TrainingRun(
        recipe=recipe, env=env, topology=topology, tokenizer=stack.tokenizer, model=stack.model,
        forward_model=stack.forward_model, optimizer=optimizer,
        scheduler=builders.build_lr_scheduler(recipe, optimizer, max_steps),
        loss_fn=builders.build_loss(recipe), train_loader=train_loader, val_loader=val_loader,
        checkpoints=checkpoints, max_steps=max_steps, grad_accumulation_steps=grad_acc,
        is_peft=stack.is_peft, architecture=stack.architecture,
    )  # fmt: skip
    if ckpt is not None:
        _restore_training_state(run, ckpt)
    return run


def _checkpoint_manager(
    recipe: dict[str, Any], run_dir: Path, env: DistEnv
) -> manager.CheckpointManager:
    section = recipe.get("checkpoint") or {}
    if (
        section.get("model_save_format", "safetensors") != "safetensors"
        or section.get("save_consolidated") is False
    ):
        raise unsupported(
            "checkpoint.model_save_format: this trainer saves consolidated "
            "safetensors only; set model_save_format: safetensors"
        )
    root = Path(section["checkpoint_dir"]) if section.get("checkpoint_dir") else None
    return manager.CheckpointManager(
        run_dir,
        env.is_rank0,
        section.get("keep_last"),
        root,
        save_optimizer=section.get("save_optimizer", True),
    )


def _restore_from(recipe: dict[str, Any]) -> str | None:
    value = recipe.get("restore_from")
    if isinstance(value, dict):
        value = value.get("path")
    return str(value) if value else None


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
    run.resumed_from = ckpt
    run.recipe_changed = state.get("recipe_hash") != recipe_hash(run.recipe)


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


def check_peft_parallelism(recipe: dict[str, Any]) -> None:
    distributed = recipe.get("distributed") or {}
    tp = int(distributed.get("tp_size") or 1)
    if recipe.get("peft") is not None and tp > 1:
        raise unsupported(
            "peft with distributed.tp_size > 1 is not supported (LoRA layers "
            "wrap the projections the TP plan shards); set distributed.tp_size: 1"
        )
    if recipe.get("peft") is not None and int(distributed.get("ep_size") or 1) > 1:
        raise unsupported(
            "peft with distributed.ep_size > 1 is not supported (LoRA wraps the grouped "
            "expert tensors that expert parallelism spreads); set distributed.ep_size: 1"
        )
