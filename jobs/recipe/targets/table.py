"""The table behind the `_target_` allowlist: every callable a recipe may name.

One `TargetSpec` per callable: its canonical dotted name, where it lives (`module:attr`),
its kind, the keyword names a recipe may give (static, so validation needs no torch; the
torch ones are checked against the real signatures by a test), the keywords the trainer
injects and the ones a recipe must give. `nemo_automodel.*` names are aliases of ours.
Operators add callables through the `tuneyard.targets` entry-point group
(`jobs.recipe.targets.plugins`), never from a recipe. `jobs.recipe.targets.allowlist` resolves and
builds through this table.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from jobs.recipe.automodel.sections import KernelValues
from jobs.recipe.targets import specs_automodel, specs_pretrain, specs_sft, specs_tool_chat
from jobs.recipe.targets.plugins import operator_specs
from jobs.recipe.targets.spec import TargetSpec
from jobs.recipe.targets.spec import spec as _spec
from jobs.recipe.targets.specs_sft import ChatTemplate

AREAS = (specs_sft, specs_pretrain, specs_automodel, specs_tool_chat)


# Keyword names of torch 2.13's optimizers, less `params` (injected); checked against
# inspect.signature by tests/unit/jobs/test_target_allowlist.py.
_OPT_COMMON = ("lr", "weight_decay", "maximize", "foreach", "differentiable")
_OPTIMIZER_PARAMS: dict[str, tuple[str, ...]] = {
    "AdamW": ("betas", "eps", "amsgrad", "capturable", "fused"),
    "Adam": ("betas", "eps", "amsgrad", "capturable", "fused", "decoupled_weight_decay"),
    "SGD": ("momentum", "dampening", "nesterov", "fused"),
    "Adagrad": ("eps", "lr_decay", "initial_accumulator_value", "fused"),
    "RMSprop": ("eps", "alpha", "momentum", "centered", "capturable"),
    "Adamax": ("betas", "eps", "capturable"),
    "NAdam": ("betas", "eps", "momentum_decay", "decoupled_weight_decay", "capturable"),
    "RAdam": ("betas", "eps", "decoupled_weight_decay", "capturable"),
    "Adadelta": ("rho", "eps", "capturable"),
}
_SCHEDULER_PARAMS: dict[str, tuple[str, ...]] = {
    "StepLR": ("step_size", "gamma"),
    "MultiStepLR": ("milestones", "gamma"),
    "ExponentialLR": ("gamma",),
    "CosineAnnealingLR": ("T_max", "eta_min"),
    "LinearLR": ("start_factor", "end_factor", "total_iters"),
    "ConstantLR": ("factor", "total_iters"),
    "PolynomialLR": ("total_iters", "power"),
    "OneCycleLR": (
        "max_lr",
        "total_steps",
        "epochs",
        "steps_per_epoch",
        "pct_start",
        "anneal_strategy",
        "cycle_momentum",
        "base_momentum",
        "max_momentum",
        "div_factor",
        "final_div_factor",
        "three_phase",
    ),
    "CosineAnnealingWarmRestarts": ("T_0", "T_mult", "eta_min"),
}
_SCHEDULER_REQUIRED = {
    "StepLR": ("step_size",),
    "MultiStepLR": ("milestones",),
    "ExponentialLR": ("gamma",),
    "CosineAnnealingLR": ("T_max",),
    "OneCycleLR": ("max_lr",),
    "CosineAnnealingWarmRestarts": ("T_0",),
}


class SquadValues(BaseModel):
    """AutoModel's make_squad_dataset keywords tuneyard accepts (and reports as ignored)."""

    model_config = ConfigDict(strict=True)
    padding: bool | str = False
    truncation: bool | str = False
    fp8: bool = False
    start_of_turn_token: str | None = None
    # the text (a template file is read at submit): rows become a user turn and the answer
    # as the assistant's, the loss on what the assistant turn adds
    chat_template: ChatTemplate | None = None


_MODEL_COMMON = (
    "dtype",
    "torch_dtype",
    "force_hf",
    "attn_implementation",
    *KernelValues.model_fields,
)
_DATASET_TOKENIZER = frozenset({"tokenizer"})


def _torch_optim_specs() -> list[TargetSpec]:
    """Every torch.optim optimizer and LR scheduler above, with its real keyword names."""
    specs = [
        _spec(
            f"torch.optim.{n}",
            f"torch.optim:{n}",
            "optimizer",
            _OPT_COMMON + extra,
            injected=("params",),
        )
        for n, extra in _OPTIMIZER_PARAMS.items()
    ]
    specs += [
        _spec(
            f"torch.optim.lr_scheduler.{n}",
            f"torch.optim.lr_scheduler:{n}",
            "lr_scheduler",
            (*extra, "last_epoch"),
            injected=("optimizer",),
            required=_SCHEDULER_REQUIRED.get(n, ()),
        )
        for n, extra in _SCHEDULER_PARAMS.items()
    ]
    return specs


_CE = ("ignore_index", "reduction", "label_smoothing")
# Loss modules, and tuneyard's own model loaders, datasets, scheduler and LoRA marker.
_OWN_SPECS = [
    _spec("torch.nn.CrossEntropyLoss", "torch.nn:CrossEntropyLoss", "loss", _CE),
    _spec(
        "torch.nn.modules.loss.CrossEntropyLoss",
        "torch.nn.modules.loss:CrossEntropyLoss",
        "loss",
        _CE,
    ),
    _spec(
        "tuneyard.loss.MaskedCrossEntropy",
        "trainer.loss:MaskedCrossEntropy",
        "loss",
        ("ignore_index", "reduction"),
    ),
    _spec(
        "tuneyard.loss.KDLoss",
        "trainer.kd_loss:KDLoss",
        "loss",
        ("ignore_index", "temperature", "fp32_upcast", "chunk_size", "reduction"),
    ),
    _spec(
        "tuneyard.models.AutoModelForCausalLM.from_pretrained",
        "models.auto:AutoModelForCausalLM.from_pretrained",
        "model",
        # `use_safetensors`: the one transformers loader option taken (`loader_kwargs`).
        ("pretrained_model_name_or_path", *_MODEL_COMMON, "trust_remote_code", "use_safetensors"),
        required=("pretrained_model_name_or_path",),
        values=KernelValues,
        overrides=True,
    ),
    _spec(
        "tuneyard.models.AutoModelForCausalLM.from_config",
        "models.auto:AutoModelForCausalLM.from_config",
        "model",
        ("config", *_MODEL_COMMON, "trust_remote_code"),
        required=("config",),
        nested={"config": ("config",)},
        values=KernelValues,
        overrides=True,
    ),
    _spec(
        "tuneyard.datasets.SquadDataset",
        "trainer.data.datasets:SquadDataset",
        "dataset",
        (
            "path_or_dataset",
            "split",
            "max_seq_length",
            "limit_dataset_samples",
            "tokenizer_name_or_path",
            *SquadValues.model_fields,
        ),
        injected=_DATASET_TOKENIZER,
        required=("path_or_dataset",),
        values=SquadValues,
        ignored={
            "padding": "batches pad to their longest sample; padding carries no loss",
            "truncation": "samples are cut to max_seq_length whenever it is set",
            "fp8": "fp8 training is refused, so no fp8 padding is needed",
            "start_of_turn_token": "the answer's first token is known exactly",
        },
    ),
    _spec(
        "tuneyard.datasets.JsonlInstructionDataset",
        "trainer.data.datasets:JsonlInstructionDataset",
        "dataset",
        (
            "path",
            "max_seq_length",
            "prompt_field",
            "completion_field",
            "messages_field",
            "limit_dataset_samples",
            "tokenizer_name_or_path",
        ),
        injected=_DATASET_TOKENIZER,
        required=("path",),
    ),
    _spec(
        "tuneyard.datasets.TextDataset",
        "trainer.data.datasets:TextDataset",
        "dataset",
        ("path", "seq_length", "tokenizer_name_or_path"),
        injected=_DATASET_TOKENIZER,
        required=("path", "seq_length"),
    ),
    _spec(
        "tuneyard.datasets.MockDataset",
        "trainer.data.datasets:MockDataset",
        "dataset",
        ("vocab_size", "seq_length", "num_samples", "seed"),
        required=("vocab_size", "seq_length"),
    ),
    _spec(
        "tuneyard.schedulers.CosineAnnealingWarmup",
        "trainer.schedulers:CosineAnnealingWarmup",
        "lr_scheduler",
        ("warmup_steps", "min_lr", "max_steps"),
        injected=("optimizer",),
    ),
    _spec(
        "tuneyard.schedulers.WarmupDecay",
        "trainer.schedulers:WarmupDecay",
        "lr_scheduler",
        (
            "max_steps",
            "lr_decay_style",
            "lr_warmup_steps",
            "lr_decay_steps",
            "init_lr",
            "max_lr",
            "min_lr",
        ),
        injected=("optimizer",),
    ),
    _spec("tuneyard.peft.LoraConfig", "jobs.recipe.load.schema:PeftSection", "peft", None),
]


_ALIASES = {
    "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy": "tuneyard.loss.MaskedCrossEntropy",
    "nemo_automodel.components.loss.kd_loss.KDLoss": "tuneyard.loss.KDLoss",
    "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
    "nemo_automodel.NeMoAutoModelForCausalLM.from_config": "tuneyard.models.AutoModelForCausalLM.from_config",
    "nemo_automodel.components._transformers.auto_model.NeMoAutoModelForCausalLM.from_pretrained": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
    "nemo_automodel.components._transformers.auto_model.NeMoAutoModelForCausalLM.from_config": "tuneyard.models.AutoModelForCausalLM.from_config",
    "nemo_automodel.datasets.squad.SquadDataset": "tuneyard.datasets.SquadDataset",
    "nemo_automodel.components.datasets.llm.squad.make_squad_dataset": "tuneyard.datasets.SquadDataset",
    "nemo_automodel.schedulers.CosineAnnealingWarmup": "tuneyard.schedulers.CosineAnnealingWarmup",
    "nemo_automodel.components._peft.lora.PeftConfig": "tuneyard.peft.LoraConfig",
}

_AREA_SPECS = [spec for area in AREAS for spec in area.SPECS]
_BUILT_IN: dict[str, TargetSpec] = {
    s.name: s for s in [*_torch_optim_specs(), *_OWN_SPECS, *_AREA_SPECS]
}
CANONICAL: dict[str, TargetSpec] = {**_BUILT_IN, **operator_specs(_BUILT_IN)}
_ALL_ALIASES = {**_ALIASES, **{k: v for area in AREAS for k, v in area.ALIASES.items()}}
TARGETS: Mapping[str, TargetSpec] = {
    **CANONICAL,
    **{alias: CANONICAL[name] for alias, name in _ALL_ALIASES.items()},
}

# AutoModel keyword names of our aliases' callables, folded onto our names.
KWARG_SYNONYMS: dict[str, dict[str, str]] = {
    "tuneyard.datasets.SquadDataset": {
        "dataset_name": "path_or_dataset",
        "seq_length": "max_seq_length",
    },
    **{name: synonyms for area in AREAS for name, synonyms in area.SYNONYMS.items()},
}
