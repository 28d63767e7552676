"""AutoModel blocks that tuneyard reads from another place, or accepts as an equivalent.

`fold_automodel_blocks` rewrites, in place and before the schema sees them:
- `distributed_config: {_target_: ...FSDP2Config | MegatronFSDPConfig | DDPConfig, ...}`
  (AutoModel's strategy block beside the sizes in `distributed:`) into `distributed:`;
- `distributed.mp_policy: {_target_: torch.distributed.fsdp.MixedPrecisionPolicy, ...}`
  into the plain policy mapping;
- `model.config: {_target_: transformers.LlamaConfig, ...}` (a transformers config class,
  also by its module: `transformers.models.llama.configuration_llama.LlamaConfig`) into the
  config mapping with its `model_type`;
- `model.config: {_target_: nemo_automodel.components.models.<family>.config.<Class>...}`
  (AutoModel's own config class) of a family transformers has into transformers' config
  (`AutoConfig.from_pretrained` of the same path, or the mapping with that model_type), with
  a warning; any other family's is not supported, named;
- `from_config` with `load_base_model: true` and a config read from a path into
  `from_pretrained` of that path (AutoModel loads the base weights), with a warning;
- `model.config: {_target_: transformers.AutoConfig.from_pretrained, <the model's own path>,
  <overrides>}` on a `from_pretrained` loader (the weights loaded with their own config,
  changed) into those overrides on the model (`_attn_implementation` is the loader's
  `attn_implementation`); the config's `trust_remote_code` must be the model's grant;
- `model: {_target_: nemo_automodel.components.models.gpt2.build_gpt2_model, <sizes>}` into
  `from_config` with a GPT-2 config of those sizes (transformers' GPT2LMHeadModel, the same
  architecture as AutoModel's own), with a warning naming what differs;
- `checkpoint.save_consolidated: false` and `model_save_format: torch_save` into
  tuneyard's one checkpoint format, with a warning saying what is written instead;
- a `tokenizer: {_target_: ...}` (or a bare `{pretrained_model_name_or_path}`) inside a
  dataset block into the recipe's `tokenizer:` section (one tokenizer serves every
  dataset), and `tokenizer.trust_remote_code` into the model's grant, which covers both;
- `parallelizer:`, `autopipeline:` and a `benchmark:` block in a training recipe into
  warnings: tuneyard applies each family's own plan, and only `llm_benchmark` benchmarks.
A conflict between two places (a strategy named twice, two values for one option) is an
error at the second place.
"""

from __future__ import annotations

import re
from typing import Any

from jobs.recipe.automodel.sections import BASE_WEIGHTS
from jobs.recipe.errors import FieldError, shown

AM_DIST = "nemo_automodel.components.distributed.config"
AUTO_TOKENIZER = "transformers.AutoTokenizer.from_pretrained"
PRETRAINED = "pretrained_model_name_or_path"
STRATEGY_CONFIGS = {
    f"{AM_DIST}.FSDP2Config": "fsdp2",
    f"{AM_DIST}.MegatronFSDPConfig": "megatron_fsdp",
    f"{AM_DIST}.DDPConfig": "ddp",
}
MP_POLICIES = {
    "torch.distributed.fsdp.MixedPrecisionPolicy",
    "torch.distributed._composable.fsdp.MixedPrecisionPolicy",
    "torch.distributed.fsdp._fully_shard.MixedPrecisionPolicy",
}
# transformers config classes by name -> the model_type their config.json carries.
CONFIG_CLASSES = {
    "LlamaConfig": "llama",
    "Qwen2Config": "qwen2",
    "Qwen3Config": "qwen3",
    "Qwen3MoeConfig": "qwen3_moe",
    "Qwen2MoeConfig": "qwen2_moe",
    "MistralConfig": "mistral",
    "MixtralConfig": "mixtral",
    "Gemma2Config": "gemma2",
    "Gemma3TextConfig": "gemma3_text",
    "GemmaConfig": "gemma",
    "Phi3Config": "phi3",
    "GPT2Config": "gpt2",
    "DeepseekV3Config": "deepseek_v3",
    "OlmoConfig": "olmo",
    "Olmo2Config": "olmo2",
    "GraniteConfig": "granite",
    "StarCoder2Config": "starcoder2",
    "FalconConfig": "falcon",
}
# `transformers.models.qwen3_moe.configuration_qwen3_moe.Qwen3MoeConfig`
_CONFIG_MODULE = re.compile(
    r"^transformers\.models\.(?P<m>\w+)\.configuration_(?P=m)\.(?P<name>\w+)$"
)
CONSOLIDATED = (
    "accepted: tuneyard writes every checkpoint as sharded state plus a "
    "consolidated Hugging Face safetensors copy (more disk per checkpoint)"
)
SAFETENSORS = (
    "accepted: checkpoints are written as safetensors, which torch, transformers and peft load"
)
IGNORED_BLOCKS = {
    "parallelizer": "tuneyard applies the model family's own parallelize plan (TP, "
    "activation checkpointing, FSDP2) from the distributed section",
    "autopipeline": "pipeline settings are read from distributed.pipeline; with pp_size 1 "
    "there is no pipeline",
}


def _distributed_config(data: dict[str, Any]) -> list[FieldError]:
    block = data.pop("distributed_config", None)
    if block is None:
        return []
    if not isinstance(block, dict):
        return [
            FieldError(
                "distributed_config",
                "must be a mapping",
                "write distributed_config: {_target_: ...FSDP2Config, ...}",
            )
        ]
    block = dict(block)
    target = block.pop("_target_", None)
    strategy = STRATEGY_CONFIGS.get(target) if isinstance(target, str) else None
    if target is not None and strategy is None:
        fix = "name one of " + ", ".join(sorted(STRATEGY_CONFIGS)) + ", or move the keys"
        return [
            FieldError(
                "distributed_config._target_", f"{shown(target)} is not a strategy config", fix
            )
        ]
    distributed = data.get("distributed")
    distributed = dict(distributed) if isinstance(distributed, dict) else {}
    errors = []
    if strategy is not None:
        block["strategy"] = strategy
    for key, value in block.items():
        if key in distributed and distributed[key] != value and key != "strategy":
            msg = f"conflicts with distributed.{key} ({shown(value)} vs {shown(distributed[key])})"
            errors.append(FieldError(f"distributed_config.{key}", msg, "keep one of the two"))
        elif key == "strategy" and distributed.get("strategy", value) != value:
            msg = (
                f"names {shown(value)} but distributed.strategy is {shown(distributed['strategy'])}"
            )
            errors.append(FieldError("distributed_config._target_", msg, "keep one of the two"))
        else:
            distributed[key] = value
    data["distributed"] = distributed
    return errors


def _mp_policy(data: dict[str, Any]) -> list[FieldError]:
    distributed = data.get("distributed")
    policy = distributed.get("mp_policy") if isinstance(distributed, dict) else None
    target = policy.get("_target_") if isinstance(policy, dict) else None
    if isinstance(target, str) and target in MP_POLICIES:
        distributed["mp_policy"] = {k: v for k, v in policy.items() if k != "_target_"}
    return []


# AutoModel's own config classes (`nemo_automodel.components.models.<family>.config.<Class>`)
# of families transformers also has (checked against the pinned transformers): there the
# module name is transformers' model_type.
TRANSFORMERS_FAMILIES = frozenset({"deepseek_v32", "deepseek_v4", "kimi_linear", "mimo_v2_flash"})
_AM_CONFIG = re.compile(
    r"^nemo_automodel\.components\.models\.(?P<family>\w+)\.config\."
    r"(?P<cls>\w+?)(?P<loader>\.from_pretrained)?$"
)


def _automodel_config_class(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """AutoModel's config class of a family transformers has becomes transformers' own:
    `<Class>.from_pretrained(path, ...)` is `AutoConfig.from_pretrained(path, ...)`, a bare
    `<Class>(...)` the config mapping with that model_type. Any other: not supported, named."""
    model = data.get("model")
    config = model.get("config") if isinstance(model, dict) else None
    target = config.get("_target_") if isinstance(config, dict) else None
    found = _AM_CONFIG.match(target) if isinstance(target, str) else None
    if found is None:
        return [], []
    family, name, loc = found["family"], found["cls"], "model.config._target_"
    if family not in TRANSFORMERS_FAMILIES:
        msg = f"{family} ({name}) is not supported by tuneyard: it is AutoModel's own model code"
        fix = "use a model family that transformers implements"
        return [FieldError(loc, msg, fix)], []
    rest = {k: v for k, v in config.items() if k != "_target_"}
    if found["loader"]:
        model["config"] = {"_target_": "transformers.AutoConfig.from_pretrained", **rest}
    else:
        model["config"] = {"model_type": family, **rest}
    msg = (
        f"AutoModel's {name} is read as transformers' {family} configuration; the model runs "
        f"as transformers implements {family}, without AutoModel's own kernels"
    )
    return [], [FieldError(loc, msg)]


def _base_model_load(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """AutoModel's `from_config(AutoConfig.from_pretrained(path, ...), load_base_model=True)`
    fine-tunes the checkpoint at `path`: here that is `from_pretrained(path)` (the config's
    keywords become its overrides, `_own_config`), never a new initialisation. Without a
    path to read the weights from it is refused."""
    model = data.get("model")
    if not isinstance(model, dict) or "load_base_model" not in model:
        return [], []
    wanted, loc = model.get("load_base_model"), "model.load_base_model"
    loader, config = model.get("_target_"), model.get("config")
    from_config = isinstance(loader, str) and loader.endswith(".from_config")
    if not from_config or wanted is not True:
        model.pop("load_base_model")
        why = "from_config starts from a new initialisation" if from_config else BASE_WEIGHTS
        return [], [FieldError(loc, f"accepted and ignored: {why}")]
    reads = isinstance(config, dict) and config.get("_target_") in AUTO_CONFIGS
    path = config.get(PRETRAINED) if reads else None
    if not isinstance(path, str):
        msg = "loads the base weights in AutoModel, but this from_config reads no checkpoint"
        fix = "use from_pretrained with pretrained_model_name_or_path, or set this false"
        return [FieldError(loc, msg, fix)], []
    model.pop("load_base_model")
    model["_target_"] = loader.removesuffix(".from_config") + ".from_pretrained"
    model.setdefault(PRETRAINED, path)
    msg = f"from_config with the base weights is from_pretrained of {shown(path)} here"
    return [], [FieldError(loc, msg)]


def _config_class(data: dict[str, Any]) -> list[FieldError]:
    model = data.get("model")
    config = model.get("config") if isinstance(model, dict) else None
    target = config.get("_target_") if isinstance(config, dict) else None
    if not isinstance(target, str) or not target.startswith("transformers."):
        return []
    module_form = _CONFIG_MODULE.match(target)  # the class by its defining module
    name = module_form["name"] if module_form else target.removeprefix("transformers.")
    model_type = CONFIG_CLASSES.get(name)
    if model_type is None:
        return []  # left for the allowlist to answer (AutoConfig.from_pretrained, or refused)
    given = config.get("model_type", model_type)
    if given != model_type:
        msg = f"{target} has model_type {model_type!r}, not {shown(given)}"
        return [FieldError("model.config.model_type", msg, "remove model_type")]
    model["config"] = {
        "model_type": model_type,
        **{k: v for k, v in config.items() if k != "_target_"},
    }
    return []


AUTO_CONFIGS = {
    "transformers.AutoConfig.from_pretrained",
    "nemo_automodel.NeMoAutoConfig.from_pretrained",
    "nemo_automodel._transformers.auto_config.NeMoAutoConfig.from_pretrained",
}
# keys of AutoConfig.from_pretrained's own section -> the loader keyword they become
_CONFIG_TO_LOADER = {"_attn_implementation": "attn_implementation"}


def _own_config(data: dict[str, Any]) -> list[FieldError]:
    """`from_pretrained(path, config=AutoConfig.from_pretrained(path, **kw))` is
    `from_pretrained(path, **kw)`: transformers applies a loader's config keywords to the
    config it reads from the same path."""
    model = data.get("model")
    config = model.get("config") if isinstance(model, dict) else None
    loader = model.get("_target_") if isinstance(model, dict) else None
    if not (
        isinstance(config, dict)
        and isinstance(config.get("_target_"), str)
        and config["_target_"] in AUTO_CONFIGS
        and isinstance(loader, str)
        and loader.endswith(".from_pretrained")
        and config.get(PRETRAINED, model.get(PRETRAINED)) == model.get(PRETRAINED)
    ):
        return []  # another config's path, or a plain mapping: the allowlist answers
    errors = []
    if config.get("trust_remote_code") is True and model.get("trust_remote_code") is not True:
        msg = "the config's repository code runs only when the model's does"
        fix = "set model.trust_remote_code: true (it needs the project's grant), or remove this"
        errors.append(FieldError("model.config.trust_remote_code", msg, fix))
    for key, value in config.items():
        if key in ("_target_", PRETRAINED, "trust_remote_code"):
            continue
        name = _CONFIG_TO_LOADER.get(key, key)
        if name in model and model[name] != value:
            msg = f"conflicts with model.{name} ({shown(value)} vs {shown(model[name])})"
            errors.append(FieldError(f"model.config.{key}", msg, "keep one of the two"))
    if errors:
        return errors
    model.pop("config")
    for key, value in config.items():
        if key not in ("_target_", PRETRAINED, "trust_remote_code"):
            model[_CONFIG_TO_LOADER.get(key, key)] = value
    return []


FROM_CONFIG = "nemo_automodel.NeMoAutoModelForCausalLM.from_config"
GPT2_BUILDER = "nemo_automodel.components.models.gpt2.build_gpt2_model"
_GPT2_SIZES = (
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "bos_token_id",
    "eos_token_id",
)
GPT2_NOTE = (
    "built as transformers' GPT2LMHeadModel from a gpt2 config of these sizes (AutoModel's "
    "builder makes its own module of the same architecture: learned positions, pre-LayerNorm "
    "blocks, exact GELU, dropout 0.1, tied embeddings); transformers starts the residual "
    "projections at std 0.02/sqrt(2 x n_layer) where AutoModel's uses 0.02"
)


def _gpt2_builder(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    model = data.get("model")
    if not (isinstance(model, dict) and model.get("_target_") == GPT2_BUILDER):
        return [], []
    sizes = {k: v for k, v in model.items() if k in _GPT2_SIZES}
    if model.get("n_ctx") is not None:  # AutoModel's legacy name for n_positions wins
        sizes["n_positions"] = model["n_ctx"]
    warnings = [FieldError("model._target_", f"accepted: {GPT2_NOTE}")]
    if "attn_implementation" in model:
        why = "AutoModel's GPT-2 builder ignores it too; the model attends with SDPA"
        warnings.append(FieldError("model.attn_implementation", f"accepted and ignored: {why}"))
    known = {"_target_", "n_ctx", "attn_implementation", *_GPT2_SIZES}
    errors = [
        FieldError(
            f"model.{key}",
            f"build_gpt2_model takes no argument {key!r} (AutoModel ignores it)",
            f"remove it; the builder takes {', '.join(('n_ctx', *_GPT2_SIZES))}",
        )
        for key in model
        if key not in known
    ]
    if errors:
        return errors, []
    config = {"model_type": "gpt2", "activation_function": "gelu", **sizes}
    data["model"] = {"_target_": FROM_CONFIG, "config": config}
    return [], warnings


def _checkpoint_format(data: dict[str, Any]) -> list[FieldError]:
    checkpoint = data.get("checkpoint")
    if not isinstance(checkpoint, dict):
        return []
    warnings = []
    if checkpoint.get("save_consolidated") is False:
        checkpoint["save_consolidated"] = True
        warnings.append(FieldError("checkpoint.save_consolidated", CONSOLIDATED))
    if checkpoint.get("model_save_format") == "torch_save":
        checkpoint["model_save_format"] = "safetensors"
        warnings.append(FieldError("checkpoint.model_save_format", SAFETENSORS))
    return warnings


def _ignored_blocks(data: dict[str, Any]) -> list[FieldError]:
    warnings = []
    for name, why in IGNORED_BLOCKS.items():
        if name in data:
            data.pop(name)
            warnings.append(FieldError(name, f"accepted and ignored: {why}"))
    return warnings


def _dataset_tokenizer(data: dict[str, Any]) -> list[FieldError]:
    """A tokenizer target inside a dataset block is the recipe's tokenizer section."""
    errors = []
    for name in ("dataset", "validation_dataset"):
        section = data.get(name)
        nested = section.get("tokenizer") if isinstance(section, dict) else None
        if isinstance(nested, dict) and "_target_" not in nested and PRETRAINED in nested:
            nested = {"_target_": AUTO_TOKENIZER, **nested}  # AutoModel's bare form
        if not (isinstance(nested, dict) and "_target_" in nested):
            continue
        section.pop("tokenizer")
        current = data.get("tokenizer")
        if current is None:
            data["tokenizer"] = nested
        elif current != nested:
            msg = "differs from the recipe's tokenizer section: one tokenizer serves every dataset"
            errors.append(FieldError(f"{name}.tokenizer", msg, "keep one tokenizer section"))
    return errors


def _tokenizer_remote_code(data: dict[str, Any]) -> list[FieldError]:
    """`tokenizer.trust_remote_code` follows the model's: the one grant covers both."""
    tokenizer = data.get("tokenizer")
    if not isinstance(tokenizer, dict) or "trust_remote_code" not in tokenizer:
        return []
    wanted = tokenizer.pop("trust_remote_code")
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    if wanted in (False, None) or model.get("trust_remote_code") is True:
        return []
    msg = "the tokenizer runs its repository's code only when the model does"
    fix = "set model.trust_remote_code: true (it needs the project's grant), or remove this"
    return [FieldError("tokenizer.trust_remote_code", msg, fix)]


def fold_automodel_blocks(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """Fold the blocks above in place: (errors, warnings)."""
    am_errors, am_warnings = _automodel_config_class(data)
    base_errors, base_warnings = _base_model_load(data)
    errors = _distributed_config(data) + _mp_policy(data) + am_errors + base_errors
    errors += _config_class(data) + _own_config(data)
    errors += _dataset_tokenizer(data) + _tokenizer_remote_code(data)
    gpt2_errors, gpt2_warnings = _gpt2_builder(data)
    warnings = am_warnings + base_warnings + gpt2_warnings + _checkpoint_format(data)
    warnings += _ignored_blocks(data)
    return errors + gpt2_errors, warnings
