"""Builders: the recipe's sections turned into objects, through the `_target_` allowlist.

Every `_target_` section goes through `jobs.recipe.targets.build` (the only place a name becomes
a callable); the trainer injects what only it knows (the tokenizer, the parameters, the
optimizer, `max_steps`). Bad user inputs surface here as `TrainerError`s: a tokenizer
that cannot be read, a tokenizer larger than the model's vocabulary, fp8/QAT on a machine
that cannot run them, LoRA options peft refuses.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from jobs.recipe import targets
from jobs.recipe.errors import RecipeInvalid
from jobs.recipe.exit_codes import ExitCode
from trainer.data.collate import Collator, PackedDataset
from trainer.data.sampler import ResumableBatchSampler
from trainer.errors import TrainerError, data_error, unsupported
from trainer.loss import MaskedCrossEntropy


def build_target(section: dict[str, Any], loc: str, **injected: Any) -> Any:
    """`jobs.recipe.targets.build`, with recipe errors and user-input errors mapped to exit codes.

    A callable refusing its arguments is a recipe error (exit 2); a dataset or model that
    cannot read its files is a data error (exit 3).
    """
    try:
        return targets.build(section, loc, **injected)
    except RecipeInvalid as exc:
        raise TrainerError(ExitCode.INVALID_RECIPE, str(exc)) from None
    except TrainerError:
        raise
    except (ValueError, TypeError, OSError) as exc:
        reads_files = loc in ("model", "dataset", "validation_dataset")
        code = (
            ExitCode.DATA_ERROR
            if reads_files and not isinstance(exc, TypeError)
            else ExitCode.INVALID_RECIPE
        )
        raise TrainerError(code, f"{loc}: {exc}") from None


def tokenizer_path(recipe: dict[str, Any]) -> str | None:
    for section in ("dataset", "validation_dataset", "model"):
        value = (recipe.get(section) or {}).get("tokenizer_name_or_path")
        if value:
            return str(value)
    model = recipe.get("model") or {}
    return model.get("pretrained_model_name_or_path")


def load_tokenizer(recipe: dict[str, Any]) -> Any | None:
    path = tokenizer_path(recipe)
    if path is None:
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise data_error(
            f"tokenizer: cannot load a tokenizer from {path} ({exc}); set "
            "dataset.tokenizer_name_or_path to a local tokenizer dir"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_model(recipe: dict[str, Any]) -> nn.Module:
    from models.auto import ModelLoadError

    try:
        return build_target(recipe["model"], "model")
    except ModelLoadError as exc:
        raise data_error(str(exc)) from None


def check_vocab(tokenizer: Any, model: nn.Module) -> None:
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if tokenizer is not None and vocab and len(tokenizer) > vocab:
        raise data_error(
            f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}: token "
            "ids would fall outside the embedding; use the model's own tokenizer "
            "(dataset.tokenizer_name_or_path)"
        )


def refuse_quantization(recipe: dict[str, Any], device: torch.device) -> None:
    """fp8 and QAT need CUDA kernels (torchao); refuse rather than train something else."""
    for name in ("fp8", "qat"):
        if (recipe.get(name) or {}).get("enabled"):
            where = "on CPU" if device.type != "cuda" else "in this trainer yet"
            raise unsupported(
                f"{name}.enabled: {name} training is not available {where}; "
                f"set {name}.enabled: false"
            )


def apply_peft(model: nn.Module, section: dict[str, Any] | None) -> nn.Module:
    if not section:
        return model
    from peft import LoraConfig, get_peft_model

    targets_ = "all-linear" if section.get("match_all_linear") else section.get("target_modules")
    try:
        config = LoraConfig(
            r=int(section.get("dim", 8)),
            lora_alpha=float(section.get("alpha", 32)),
            lora_dropout=float(section.get("dropout", 0.0)),
            target_modules=targets_ or "all-linear",
            exclude_modules=section.get("exclude_modules") or None,
            use_dora=bool(section.get("use_dora")),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, config)
    except ValueError as exc:
        raise TrainerError(ExitCode.INVALID_RECIPE, f"peft: {exc}") from None


def packing(recipe: dict[str, Any], dataset_section: dict[str, Any]) -> int:
    """The pack size (0: no packing)."""
    section = recipe.get("packed_sequence") or {}
    size = int(section.get("packed_sequence_size") or 0)
    enabled = section.get("enabled")
    if enabled is False:
        return 0
    if enabled and not size:
        size = int(dataset_section.get("max_seq_length") or dataset_section.get("seq_length") or 0)
        if not size:
            raise TrainerError(
                ExitCode.INVALID_RECIPE,
                "packed_sequence.packed_sequence_size: "
                "set it (or dataset.max_seq_length) when packing is enabled",
            )
    return size


def build_dataset(recipe: dict[str, Any], name: str, tokenizer: Any) -> Dataset | None:
    section = recipe.get(name)
    if not section:
        return None
    dataset = build_target(section, name, tokenizer=tokenizer)
    pack_size = packing(recipe, section)
    if pack_size:
        dataset = PackedDataset(dataset, pack_size)
    if len(dataset) == 0:
        raise data_error(f"{name}: the dataset is empty")
    return dataset


def build_loader(
    dataset: Dataset,
    section: dict[str, Any],
    batch_size: int,
    *,
    seed: int,
    dp_rank: int,
    dp_size: int,
    collator: Collator,
    train: bool,
) -> DataLoader:
    sampler = ResumableBatchSampler(
        len(dataset),
        batch_size,
        dp_rank,
        dp_size,
        shuffle=bool(section.get("shuffle", train)),
        seed=seed,
        drop_last=train,
    )
    if train and len(sampler) == 0:
        raise data_error(
            f"dataset: {len(dataset)} samples are fewer than one batch per rank "
            f"({batch_size} x {dp_size} ranks); add data or lower the batch size"
        )
    workers = int(section.get("num_workers") or 0)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collator,
        num_workers=workers,
        pin_memory=bool(section.get("pin_memory")) and torch.cuda.is_available(),
        persistent_workers=workers > 0 and bool(section.get("persistent_workers")),
        # its own generator: creating an iterator (as a resume does mid-epoch) must not
        # draw from the global RNG that dropout uses, or resumed runs would diverge
        generator=torch.Generator().manual_seed(seed),
    )


def build_optimizer(recipe: dict[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainerError(ExitCode.INVALID_RECIPE, "peft/model: no trainable parameters")
    return build_target(recipe["optimizer"], "optimizer", params=params)


def build_lr_scheduler(
    recipe: dict[str, Any], optimizer: torch.optim.Optimizer, max_steps: int
) -> Any:
    section = recipe.get("lr_scheduler")
    if not section:
        return None
    return build_target(section, "lr_scheduler", optimizer=optimizer, max_steps=max_steps)


def build_loss(recipe: dict[str, Any]) -> nn.Module:
    section = recipe.get("loss_fn")
    return build_target(section, "loss_fn") if section else MaskedCrossEntropy()
