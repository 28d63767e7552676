"""Builders: the typed recipe's sub-objects turned into torch objects, through the allowlist.

Each builder takes the sub-object it needs (a `TargetCall`, the `DataLoader` or `Peft`
section), never the whole recipe. Every `_target_` goes through `jobs.recipe.targets.allowlist.instantiate`
(the only place a name becomes a callable; the schema is not run again); the trainer injects what only it knows (the
tokenizer, the parameters, the optimizer, `max_steps`). Validation already refused what the
trainer cannot run; what is left surfaces here as `TrainerError`s about the data: a
tokenizer that cannot be read or is larger than the model's vocabulary, an empty dataset.
A loader kernel option that fell back is reported as a `kernel_fallback` event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from jobs.recipe.errors import RecipeInvalid
from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.model.lora_targets import lora_targets, selects
from jobs.recipe.targets import allowlist as targets
from jobs.recipe.typed import DataLoader as LoaderSpec
from jobs.recipe.typed import PackedSequence, Peft, Recipe, TargetCall
from trainer.data.collate import Collator, PackedDataset
from trainer.data.sampler import ResumableBatchSampler
from trainer.errors import TrainerError, data_error


def build_target(call: TargetCall, loc: str, **injected: Any) -> Any:
    """`jobs.recipe.targets.allowlist.instantiate`, with errors mapped to exit codes.

    A callable refusing its arguments is a recipe error (exit 2); a dataset or model that
    cannot read its files is a data error (exit 3).
    """
    try:
        return targets.instantiate(call, loc, **injected)
    except RecipeInvalid as exc:
        raise TrainerError(ExitCode.INVALID_RECIPE, str(exc)) from None
    except TrainerError:
        raise
    except (ValueError, TypeError, OSError) as exc:
        reads_files = loc in ("model", "teacher_model", "dataset", "validation_dataset")
        code = (
            ExitCode.DATA_ERROR
            if reads_files and not isinstance(exc, TypeError)
            else ExitCode.INVALID_RECIPE
        )
        raise TrainerError(code, f"{loc}: {exc}") from None


def load_tokenizer(recipe: Recipe) -> Any | None:
    """The tokenizer, from local files or the hub cache only; remote code only as the model's
    grant (validation refused it unless the operator allows it). A recipe's `tokenizer:`
    section (validation lifts a dataset's own into it) is built through the allowlist."""
    from trainer.data.tokenizer import from_pretrained

    remote_code = recipe.trust_remote_code
    if recipe.tokenizer is not None:
        return build_target(recipe.tokenizer, "tokenizer", trust_remote_code=remote_code)
    path = recipe.tokenizer_source
    return None if path is None else from_pretrained(path, trust_remote_code=remote_code)


def build_model(call: TargetCall, loc: str = "model") -> nn.Module:
    from models.common.config import ModelLoadError

    try:
        return build_target(call, loc)
    except ModelLoadError as exc:
        raise data_error(str(exc)) from None


def report_kernel_fallbacks(model: nn.Module, log: Any, step: int) -> None:
    """One `kernel_fallback` warning event per loader kernel option that could not apply
    (no CUDA, liger_kernel not importable, ...): the run trains on with its own layers."""
    from models.common.kernels import kernel_fallbacks

    for option, reason in kernel_fallbacks(model):
        log.event("kernel_fallback", step, option=f"model.{option}", message=reason)


def check_vocab(tokenizer: Any, model: nn.Module) -> None:
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if tokenizer is not None and vocab and len(tokenizer) > vocab:
        raise data_error(
            f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}: token "
            "ids would fall outside the embedding; use the model's own tokenizer "
            "(dataset.tokenizer_name_or_path)"
        )


def apply_peft(model: nn.Module, peft: Peft | None) -> nn.Module:
    """peft's LoRA on the selected linear layers, and AutoModel's expert adapters
    (`models.common.moe.lora`) on grouped experts a target pattern names (`*`,
    `*.mlp.experts`): `match_all_linear` and exclusion-only forms adapt linear layers only."""
    if peft is None:
        return model
    from peft import LoraConfig, get_peft_model

    patterns = None if peft.match_all_linear else lora_targets(peft.target_modules)
    targets_ = patterns or "all-linear"
    excluded = list(peft.exclude_modules or [])
    if targets_ == "all-linear":  # peft spares the output layer of transformers classes only
        excluded += _output_layer_names(model)
    # Globs become one regex, as for target_modules: peft reads a list as name suffixes.
    excluded_ = lora_targets(excluded) if excluded else None
    experts = [m for _, m in _selected(model, patterns, excluded_, _is_experts)] if patterns else []
    if isinstance(targets_, str) and targets_ != "all-linear":
        # a glob selects linear layers (AutoModel's matcher), never norms or containers
        targets_ = [name for name, _ in _selected(model, targets_, excluded_, _is_linear)]
        if not targets_:
            raise data_error(
                "peft.target_modules: matches no linear layer of the model; tuneyard's LoRA "
                "adapts at least one (add e.g. '*.self_attn.q_proj')"
            )
    expert_adapters = _adapt_experts(model, experts, peft)
    try:
        config = LoraConfig(
            r=peft.dim,
            lora_alpha=peft.alpha,
            lora_dropout=peft.dropout,
            target_modules=targets_,
            exclude_modules=excluded_,
            use_dora=peft.use_dora,
            task_type="CAUSAL_LM",
        )
        with _v4_names_kept(model):
            adapted = get_peft_model(model, config)
    except ValueError as exc:
        raise data_error(f"peft: the model refuses this LoRA setting: {exc}") from None
    for param in expert_adapters:  # peft froze every parameter but its own layers'
        param.requires_grad_(True)
    return adapted


_CLASS_VALUE = object()


@contextlib.contextmanager
def _v4_names_kept(model: nn.Module) -> Iterator[None]:
    """Under transformers v5, peft rewrites LoRA targets of some MoE model types (by
    `config.model_type`) onto v5's fused expert parameters: `all-linear` or a `down_proj`
    target would put peft's parameter LoRA on the router and the experts. A native class
    keeps the v4 module layout, so for it the model type is hidden while peft injects."""
    from models.hooks import native_entry

    config = getattr(model, "config", None)
    if config is None or native_entry(model) is None:
        yield
        return
    own = vars(config).get("model_type", _CLASS_VALUE)
    config.model_type = None
    try:
        yield
    finally:
        if own is _CLASS_VALUE:
            del config.model_type  # the config class's own value again
        else:
            config.model_type = own


def _is_linear(name: str, module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def _is_experts(name: str, module: nn.Module) -> bool:
    """A routed-experts module, native or a Hugging Face class's: `...mlp.experts`."""
    return name.rsplit(".", 1)[-1] == "experts" and not _is_linear(name, module)


def _selected(
    model: nn.Module, targets: Any, excluded: Any, kind: Any
) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs of `kind` the patterns select and the exclusions leave."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if name
        and kind(name, module)
        and selects(targets, name)
        and not (excluded and selects(excluded, name))
    ]


def _adapt_experts(model: nn.Module, experts: list[nn.Module], peft: Peft) -> list[nn.Parameter]:
    """Expert adapters of rank dim (dim // experts per token with `moe_rank_scaling`), on
    the grouped experts of a family whose row says it saves them (`supports_expert_lora`)."""
    from models.common.moe.layers import GroupedExperts
    from models.common.moe.lora import add_expert_lora
    from models.hooks import capabilities

    if not experts:
        return []
    supported = capabilities(model).supports_expert_lora
    if not supported or not all(isinstance(m, GroupedExperts) for m in experts):
        kind = type(experts[0]).__name__
        raise data_error(
            f"peft.target_modules: selects the routed experts ({kind}), which tuneyard's LoRA "
            "does not adapt for this model; target linear layers by name (e.g. ['*_proj'])"
        )
    if peft.use_dora:
        raise data_error(
            "peft.use_dora: DoRA on routed experts is not supported (AutoModel refuses it "
            "too); leave the experts out of peft.target_modules or set use_dora: false"
        )
    rank = peft.dim
    if peft.moe_rank_scaling:
        rank = peft.dim // int(model.config.num_experts_per_tok)
        if rank < 1:
            raise data_error(
                f"peft.moe_rank_scaling: rank {peft.dim} // "
                f"{model.config.num_experts_per_tok} experts per token is 0; raise peft.dim"
            )
    return [p for module in experts for p in add_expert_lora(module, rank, peft.alpha)]


def _output_layer_names(model: nn.Module) -> list[str]:
    """The output projection (lm_head): LoRA on it would save the whole vocab matrix."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules() if head is not None and module is head]


def build_dataset(
    call: TargetCall | None, name: str, packed: PackedSequence, tokenizer: Any
) -> Dataset | None:
    if call is None:
        return None
    dataset = build_target(call, name, tokenizer=tokenizer)
    if packed.enabled:  # validation resolved the pack size
        dataset = PackedDataset(
            dataset,
            packed.packed_sequence_size,
            split_across_pack=packed.split_across_pack,
            max_packs=packed.max_packs,
            drop_long_samples=packed.drop_long_samples,
        )
    if len(dataset) == 0:
        raise data_error(f"{name}: the dataset is empty")
    return dataset


def build_loader(
    dataset: Dataset,
    section: LoaderSpec,
    *,
    seed: int,
    dp_rank: int,
    dp_size: int,
    collator: Collator,
    train: bool,
) -> DataLoader:
    sampler = ResumableBatchSampler(
        len(dataset),
        section.batch_size,
        dp_rank,
        dp_size,
        shuffle=section.shuffle,
        seed=seed,
        drop_last=train,
    )
    if train and len(sampler) == 0:
        raise data_error(
            f"dataset: {len(dataset)} samples are fewer than one batch per rank "
            f"({section.batch_size} x {dp_size} ranks); add data or lower the batch size"
        )
    workers = section.num_workers
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collator,
        num_workers=workers,
        pin_memory=section.pin_memory and torch.cuda.is_available(),
        persistent_workers=workers > 0 and section.persistent_workers,
        # its own generator: creating an iterator (as a resume does mid-epoch) must not
        # draw from the global RNG that dropout uses, or resumed runs would diverge
        generator=torch.Generator().manual_seed(seed),
    )


def build_optimizer(call: TargetCall, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise data_error("peft.target_modules: no module of the model matched; nothing trains")
    return build_target(call, "optimizer", params=params)


def build_lr_scheduler(
    call: TargetCall | None, optimizer: torch.optim.Optimizer, max_steps: int
) -> Any:
    if call is None:
        return None
    return build_target(call, "lr_scheduler", optimizer=optimizer, max_steps=max_steps)


def build_loss(call: TargetCall) -> nn.Module:
    return build_target(call, "loss_fn")
