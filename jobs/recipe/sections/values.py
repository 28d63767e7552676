"""Value rules of single sections: the optimizer's learning rate, the scheduler's bounds,
PEFT (and its MoE rank scaling, against the model's config), sequence packing, the tokens
of one micro-batch and the dataset's numeric keywords (each within its maximum in
`jobs.recipe.load.limits`).
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.load import limits
from jobs.recipe.load.plain import is_number
from jobs.recipe.paths.data import DATASET_NAME_KEYS, spec_of
from jobs.recipe.paths.roots import name_errors
from jobs.recipe.plan.batches import seq_length_of


def check_optimizer(optimizer: dict[str, Any]) -> list[FieldError]:
    lr = optimizer.get("lr")
    if lr is not None and (not is_number(lr) or lr <= 0):
        return [
            FieldError(
                "optimizer.lr", f"must be a number > 0, got {shown(lr)}", "set optimizer.lr: 1.0e-5"
            )
        ]
    return []


def check_lr_scheduler(
    scheduler: dict[str, Any],
    lr: Any,
    max_steps: int | None,
) -> list[FieldError]:
    errors: list[FieldError] = []
    min_lr, warmup = scheduler.get("min_lr"), scheduler.get("warmup_steps")
    if min_lr is not None and (not is_number(min_lr) or min_lr < 0):
        errors.append(
            FieldError(
                "lr_scheduler.min_lr",
                f"must be a number >= 0, got {shown(min_lr)}",
                "set lr_scheduler.min_lr: 0.0",
            )
        )
    elif min_lr is not None and is_number(lr) and min_lr > lr:
        errors.append(
            FieldError(
                "lr_scheduler.min_lr",
                f"{min_lr} is above optimizer.lr {lr}",
                f"set lr_scheduler.min_lr <= {lr}",
            )
        )
    errors += _step_count_errors(scheduler, "warmup_steps", 0)
    errors += _step_count_errors(scheduler, "max_steps", 1)
    if not any(e.loc.endswith(("warmup_steps", "max_steps")) for e in errors):
        limit = scheduler.get("max_steps") or max_steps
        if warmup is not None and isinstance(limit, int) and warmup > limit:
            errors.append(
                FieldError(
                    "lr_scheduler.warmup_steps",
                    f"{warmup} exceeds max_steps {limit}",
                    f"set lr_scheduler.warmup_steps <= {limit}",
                )
            )
    return errors


def _step_count_errors(scheduler: dict[str, Any], key: str, low: int) -> list[FieldError]:
    """A scheduler's step count: an integer from `low` to `MAX_STEPS`, or absent."""
    value = scheduler.get(key)
    if value is None or _count_in(value, low, limits.MAX_STEPS):
        return []
    return [
        FieldError(
            f"lr_scheduler.{key}",
            f"must be an integer from {low} to at most {limits.at_most(limits.MAX_STEPS)}, "
            f"got {shown(value)}",
            f"set lr_scheduler.{key} to an integer from {low} to {limits.MAX_STEPS}",
        )
    ]


def _count_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_peft(peft: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[FieldError]]:
    if peft is None:
        return None, []
    if peft.get("match_all_linear") and peft.get("target_modules"):
        return None, [
            FieldError(
                "peft.target_modules",
                "cannot be combined with match_all_linear: true",
                "remove one of peft.target_modules and peft.match_all_linear",
            )
        ]
    if peft.get("match_all_linear") is None:
        peft = {**peft, "match_all_linear": not peft.get("target_modules")}
    return peft, []


def check_packing(
    packed: dict[str, Any],
    dataset: dict[str, Any],
    loaders: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[FieldError]]:
    """Resolve `enabled` and the pack size; the THD collater in `loaders` needs packed rows."""
    from jobs.recipe.load.schema import THD_COLLATE_FN  # schema's constant; no import cycle

    enabled = packed.get("enabled")
    size = packed.get("packed_sequence_size") or 0
    if enabled is None:
        enabled = size > 0
    packed = {**packed, "enabled": enabled}
    if enabled and size == 0:
        seq = dataset.get("max_seq_length") or dataset.get("seq_length")
        if not isinstance(seq, int) or seq <= 0:
            return packed, [
                FieldError(
                    "packed_sequence.packed_sequence_size",
                    "packing needs a pack size",
                    "set packed_sequence.packed_sequence_size",
                )
            ]
        packed["packed_sequence_size"] = seq
    errors = micro_batch_errors(packed, dataset, (loaders or {}).get("dataloader"))
    errors += [
        FieldError(
            f"{name}.collate_fn",
            "packed_sequence_thd_collater collates packed rows, but packing is off",
            "set packed_sequence.packed_sequence_size (e.g. 1024), or use "
            "nemo_automodel.components.datasets.utils.default_collater",
        )
        for name, loader in (loaders or {}).items()
        if not enabled and isinstance(loader, dict) and loader.get("collate_fn") == THD_COLLATE_FN
    ]
    return packed, errors


def micro_batch_errors(
    packed: dict[str, Any], dataset: dict[str, Any], loader: dict[str, Any] | None
) -> list[FieldError]:
    """One rank's micro-batch (the loader's batch size, which the batch arithmetic has
    resolved, x the row length the plan counts) within `MAX_MICRO_BATCH_TOKENS`: the
    activation estimate multiplies it with the model's widths and depth."""
    rows = (loader or {}).get("batch_size")
    length = seq_length_of({"packed_sequence": packed, "dataset": dataset})
    if not isinstance(rows, int) or not length or rows * length <= limits.MAX_MICRO_BATCH_TOKENS:
        return []
    most = max(1, limits.MAX_MICRO_BATCH_TOKENS // length)
    return [
        FieldError(
            "dataloader.batch_size",
            f"{rows} rows of {length} tokens make {rows * length} tokens per micro-batch; at "
            f"most {limits.at_most(limits.MAX_MICRO_BATCH_TOKENS)} are accepted",
            f"set dataloader.batch_size to at most {most} (step_scheduler.global_batch_size "
            "stays, with more grad accumulation), or shorten the sequences",
        )
    ]


# Numeric keywords of a dataset section: each a positive integer up to its maximum.
_DATASET_MAXIMA = {
    "max_seq_length": limits.MAX_SEQ_LENGTH,
    "seq_length": limits.MAX_SEQ_LENGTH,
    "limit_dataset_samples": limits.MAX_DATASET_SAMPLES,
    "num_samples": limits.MAX_DATASET_SAMPLES,
    "vocab_size": limits.MAX_VOCAB_SIZE,
}


DATASET_NUMBER_KEYS = (*_DATASET_MAXIMA, "seed")  # seed: any integer


def check_dataset_values(section: dict[str, Any], loc: str) -> list[FieldError]:
    errors = []
    for key, most in _DATASET_MAXIMA.items():
        value = section.get(key)
        if value is not None and not _count_in(value, 1, most):
            errors.append(
                FieldError(
                    f"{loc}.{key}",
                    f"must be a positive integer of at most {limits.at_most(most)}, "
                    f"got {shown(value)}",
                    f"set {loc}.{key} to a positive integer <= {most}",
                )
            )
    spec = spec_of(section)
    names = {**DATASET_NAME_KEYS, **(spec.names if spec is not None else {})}
    for key, example in names.items():
        if section.get(key) is not None:
            errors += name_errors(section[key], f"{loc}.{key}", example)
    return errors


# Config keys that give a model's routed-expert count, as transformers' MoE configs name it.
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def has_experts(config: dict[str, Any] | None) -> bool | None:
    """Whether the config has routed experts; None when it is not known (no config)."""
    if not isinstance(config, dict):
        return None
    inner = config.get("text_config")
    counts = [config.get(k) for k in EXPERT_COUNT_KEYS]
    counts += [inner.get(k) for k in EXPERT_COUNT_KEYS] if isinstance(inner, dict) else []
    return any(is_number(n) and n > 1 for n in counts)


def check_moe_rank_scaling(
    peft: dict[str, Any] | None, config: dict[str, Any] | None, architecture: str | None
) -> tuple[list[FieldError], list[FieldError]]:
    """`peft.moe_rank_scaling: true`: the experts' adapters get rank dim // experts per
    token (AutoModel's rule, floor division with a warning); a model without experts ignores
    it with a warning. (errors, warnings)"""
    if peft is None or not peft.get("moe_rank_scaling"):
        return [], []
    loc = "peft.moe_rank_scaling"
    if has_experts(config) is False:
        peft["moe_rank_scaling"] = False
        who = shown(architecture) if architecture else "the model"
        msg = f"accepted and ignored: {who} has no experts, so no LoRA rank is scaled"
        return [], [FieldError(loc, msg)]
    top_k = (config or {}).get("num_experts_per_tok")
    dim = peft.get("dim", 8)
    if not is_number(top_k) or top_k < 1 or not is_number(dim):
        return [], []  # the trainer reads the count from the model it builds
    if dim < top_k:
        msg = f"gives the experts' adapters rank {dim} // {top_k} experts per token = 0"
        return [FieldError(loc, msg, f"set peft.dim to at least {top_k}, or this to false")], []
    if dim % top_k:
        msg = f"peft.dim {dim} is not a multiple of {top_k} experts per token: rank {dim // top_k}"
        return [], [FieldError(loc, msg)]
    return [], []


# Random-token datasets, and the vocabulary their ids are drawn below when none is given
# (`trainer.data.mock.MockIterableDataset`'s default; `MockDataset` requires one).
MOCK_DATASETS = {
    "tuneyard.datasets.MockIterableDataset": 1024,
    "tuneyard.datasets.MockSentenceDataset": 100,
    "tuneyard.datasets.MockDataset": 0,
}


def model_vocab_size(config: dict[str, Any] | None) -> int | None:
    """The model's vocabulary size from its config (a multimodal one's `text_config`)."""
    if not isinstance(config, dict):
        return None
    inner = config.get("text_config")
    for holder in (config, inner if isinstance(inner, dict) else {}):
        size = holder.get("vocab_size")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return None


def mock_vocab_errors(out: dict[str, Any], config: dict[str, Any] | None) -> list[FieldError]:
    """A random-token dataset drawing ids the model's embedding does not have would fail at
    the first lookup: its `vocab_size` must not exceed the model's (where the config is
    readable)."""
    model_vocab = model_vocab_size(config)
    errors = []
    for name in ("dataset", "validation_dataset"):
        section = out.get(name)
        spec = spec_of(section) if isinstance(section, dict) else None
        if model_vocab is None or spec is None or spec.name not in MOCK_DATASETS:
            continue
        drawn = section.get("vocab_size", MOCK_DATASETS[spec.name])
        if isinstance(drawn, int) and drawn > model_vocab:
            given = "" if "vocab_size" in section else " (the default)"
            msg = (
                f"{drawn}{given} draws token ids the model does not have: its vocab_size is "
                f"{model_vocab}, so the embedding lookup would fail"
            )
            fix = f"set {name}.vocab_size to at most {model_vocab} (the model's vocab_size)"
            errors.append(FieldError(f"{name}.vocab_size", msg, fix))
    return errors
