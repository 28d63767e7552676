"""What validation can learn about the model without torch: its config, architecture, size.

The model section names a local directory (read its `config.json` with json), a hub name
(read the config from the Hugging Face cache when it is there), or an inline `config` dict
for `from_config`. A config file is opened only through `jobs.recipe.paths.roots.read_bounded`:
its real path inside the roots its directory was checked against (the hub cache for a hub
name), at most `CONFIG_FILE_CAP` bytes. From the config come the architecture (whose
capabilities the torch-free `models.registry` table gives), the parameter count (exact for
native families, `jobs.recipe.plan.flops`) and `vocab_size`. `check_model_kwargs` refuses the
legacy flat loader kwargs that now live in the `distributed` section, unknown dtypes,
`trust_remote_code: true` without the grant, and `use_safetensors: false` (pickled weights)
without the operator's `allow_pickle_weights` (`jobs.recipe.targets.loader_kwargs`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip, shown
from jobs.recipe.model.native_fallbacks import NATIVE_ONLY_TP, hf_fallback_reason
from jobs.recipe.paths.roots import Roots, read_bounded
from jobs.recipe.plan.flops import param_count
from jobs.recipe.targets.loader_kwargs import weight_format_errors
from jobs.recipe.topology.trainer_support import lora_tensor_parallel_errors
from models.registry import (
    NATIVE_ROPE_TYPES,
    ModelCapabilities,
    capabilities_for,
    registered_architectures,
)

DTYPES = ("float32", "bfloat16", "float16", "auto")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flex_attention")
LEGACY_KWARGS = {
    "distributed_config": "put the strategy and its options in the distributed section",
    "moe_mesh": "set distributed.ep_size instead",
    "pipeline_config": "move it to distributed.pipeline",
    "moe_config": "move it to distributed.moe (it is now moe_parallel_config)",
    "activation_checkpointing": "move it to distributed.activation_checkpointing",
    "tp_plan": "set distributed.tp_size; the tensor-parallel plan comes from the model registry",
}


REMOTE_CODE_FIX = (
    "remove model.trust_remote_code, or have it allowed: the operator sets "
    "TUNEYARD_ALLOW_REMOTE_CODE=1, or a project admin sends PATCH /v1/projects/<name> "
    '{"allow_remote_code": true}'
)


def check_model_kwargs(
    model: dict[str, Any], allow_remote_code: bool = False, allow_pickle_weights: bool = False
) -> list[FieldError]:
    """Loader-kwarg rules; pops the legacy keys so the allowlist check does not repeat them."""
    errors = _legacy_kwarg_errors(model) + _topology_kwarg_errors(model) + _value_errors(model)
    errors += weight_format_errors(model, allow_pickle_weights)
    return errors + _remote_code_errors(model, allow_remote_code)


def _remote_code_errors(model: dict[str, Any], allowed: bool) -> list[FieldError]:
    value = model.get("trust_remote_code")
    if value in (None, False):
        return []
    if value is not True:
        return [FieldError("model.trust_remote_code", "must be true or false", "set true or false")]
    if allowed:
        return []
    msg = "remote code is not allowed for this project (it would run the model's own Python)"
    return [FieldError("model.trust_remote_code", msg, REMOTE_CODE_FIX)]


def _legacy_kwarg_errors(model: dict[str, Any]) -> list[FieldError]:
    present = [key for key in LEGACY_KWARGS if key in model]
    for key in present:
        model.pop(key)
    return [
        FieldError(f"model.{key}", "is a legacy flat loader argument", LEGACY_KWARGS[key])
        for key in present
    ]


def _topology_kwarg_errors(model: dict[str, Any]) -> list[FieldError]:
    given = [key for key in ("distributed_setup", "device_mesh") if key in model]
    for key in given:
        model.pop(key)
    fix = "describe the topology in the distributed section"
    if len(given) == 2:
        msg = "distributed_setup and device_mesh are mutually exclusive"
        return [FieldError("model.device_mesh", msg, f"remove both; {fix}")]
    return [FieldError(f"model.{key}", "cannot be given in a recipe", fix) for key in given]


def _value_errors(model: dict[str, Any]) -> list[FieldError]:
    errors = [
        FieldError(
            f"model.{key}", f"unknown dtype {shown(model[key])}", f"use one of {', '.join(DTYPES)}"
        )
        for key in ("dtype", "torch_dtype")
        if model.get(key) is not None and str(model[key]).removeprefix("torch.") not in DTYPES
    ]
    attn = model.get("attn_implementation")
    if attn is not None and attn not in ATTN_IMPLEMENTATIONS:
        errors.append(
            FieldError(
                "model.attn_implementation",
                f"unknown implementation {shown(attn)}",
                f"use one of {', '.join(ATTN_IMPLEMENTATIONS)}",
            )
        )
    return errors


# A Llama-70B config.json is ~1 KB; 4 MiB leaves room for long rope tables and refuses a file
# whose parsing alone would cost memory per request.
CONFIG_FILE_CAP = 4 << 20
REF_FILE_CAP = 256  # refs/main holds one commit hash
REVISION = re.compile(r"\A[A-Za-z0-9._-]+\Z")


def hub_cache_root() -> Path:
    """Where hub snapshots live, read from the environment as `trainer.data.hub` reads it."""
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return Path(hub).expanduser()
    default = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(os.environ.get("HF_HOME") or default).expanduser() / "hub"


def _main_revision(repo: Path, cache: Path) -> str | None:
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    data, _ = read_bounded(ref, "refs/main", [cache], REF_FILE_CAP)
    revision = data.decode("utf-8", "replace").strip() if data is not None else ""
    return revision if REVISION.match(revision) and revision.strip(".") else None


def hub_cache_config(name: str) -> Path | None:
    """config.json of a hub model in the local Hugging Face cache, if it is there."""
    cache = hub_cache_root()
    repo = cache / ("models--" + name.replace("/", "--"))
    if not os.path.isdir(repo):  # False, not OSError, for a name too long to be a file name
        return None
    revision = _main_revision(repo, cache)
    if revision is not None:
        candidate = repo / "snapshots" / revision / "config.json"
        if candidate.is_file():
            return candidate
    return min(repo.glob("snapshots/*/config.json"), default=None)


def read_config_file(
    path: Path, loc: str, roots: Roots | list[Path]
) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """A local model dir's (or a config file's) config.json as a dict.

    `roots` are those the directory was checked against (the data roots, or the hub cache
    for a hub name): the file is read only if its real path stays inside them, and only up
    to `CONFIG_FILE_CAP` bytes.
    """
    file = path / "config.json" if path.is_dir() else path
    if not os.path.lexists(file):
        return None, [
            FieldError(
                loc,
                f"{shown(str(path))} has no config.json",
                "point it at a Hugging Face model directory",
            )
        ]
    data, errors = read_bounded(file, loc, roots, CONFIG_FILE_CAP)
    if data is None:
        return None, errors
    try:
        config = json.loads(data)
    except ValueError as exc:
        return None, [
            FieldError(loc, f"cannot read {shown(str(file))}: {exc}", "fix the model's config.json")
        ]
    if not isinstance(config, dict):
        return None, [
            FieldError(
                loc, f"{shown(str(file))} is not a JSON object", "fix the model's config.json"
            )
        ]
    return config, []


def architecture_of(config: dict[str, Any] | None) -> str | None:
    if not config:
        return None
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    model_type = config.get("model_type")
    for entry in registered_architectures():
        if model_type and model_type in entry.config_model_types:
            return entry.architecture
    return None


def estimate_param_count(config: dict[str, Any] | None) -> int | None:
    """The parameter count from the config: exact for the native families (the registry
    family's weight list in `jobs.recipe.plan.flops`), Llama-style arithmetic otherwise; None
    when the config lacks the sizes."""
    if not config:
        return None
    try:
        return param_count(config)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None


# Every size here depends on the model (the registry row's capabilities); what the trainer
# cannot combine with each is jobs.recipe.topology.trainer_support's and pipeline_rules'.
_CAPABILITY_FIELDS = (
    ("tp_size", "supports_tp", "tensor parallelism"),
    ("pp_size", "supports_pp", "pipeline parallelism"),
    ("cp_size", "supports_cp", "context parallelism"),
    ("ep_size", "supports_ep", "expert parallelism"),
)


def context_parallel_config_errors(
    config: dict[str, Any] | None, distributed: dict[str, Any]
) -> list[FieldError]:
    """Configs whose model context parallelism cannot run although its architecture can:
    sliding-window layers (a window over global positions the chunks do not mask) and rope
    types that load the Hugging Face class (no context-parallel attention)."""
    if not config or int(distributed.get("cp_size") or 1) == 1:
        return []
    reasons = []
    if _sliding_window(config):
        reasons.append("sliding-window attention layers")
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in NATIVE_ROPE_TYPES:
        reasons.append(f"rope_type {shown(rope_type)} (loads the Hugging Face class)")
    return [
        FieldError(
            "distributed.cp_size",
            f"context parallelism cannot run this model's {reason}",
            "set distributed.cp_size: 1",
        )
        for reason in reasons
    ]


# Architectures whose Hugging Face class fuses q/k/v and gate/up (the native class splits
# them): the tensor-parallel plan shards only the native class.
HF_CLASS_WITHOUT_TP = ("Phi3ForCausalLM",)
_NATIVE_ATTENTION = (None, "sdpa", "eager")


def tensor_parallel_config_errors(
    config: dict[str, Any] | None, distributed: dict[str, Any], model: dict[str, Any] | None = None
) -> list[FieldError]:
    """Model settings whose tensor parallelism cannot run although the architecture's can:
    residual dropout (`resid_pdrop`, Phi-3), which each tp rank would draw differently for
    the block outputs the ranks share, and the Hugging Face class of an architecture whose
    layers it fuses (`force_hf`, another `attn_implementation`). The family's parallel plan
    refuses the same in the trainer."""
    architecture = architecture_of(config) if config else None
    if not architecture or int(distributed.get("tp_size") or 1) == 1:
        return []
    if not capabilities_for(architecture).supports_tp:
        return []  # capability_errors already refuses tp for this architecture
    errors = []
    rate = config.get("resid_pdrop")
    if isinstance(rate, int | float) and rate > 0:
        errors.append(
            FieldError(
                "distributed.tp_size",
                f"tensor parallelism cannot run this model's residual dropout (resid_pdrop {rate})",
                "set distributed.tp_size: 1, or resid_pdrop: 0.0 in the model section",
            )
        )
    if architecture in HF_CLASS_WITHOUT_TP or architecture in NATIVE_ONLY_TP:
        errors += _fused_hf_class_errors(architecture, model or {})
    reason = hf_fallback_reason(architecture, config)
    if reason:
        errors.append(
            FieldError(
                "distributed.tp_size",
                f"this {architecture} config loads with the Hugging Face class ({reason}), "
                "which the family's tensor-parallel plan cannot shard",
                "set distributed.tp_size: 1",
            )
        )
    return errors


def _fused_hf_class_errors(architecture: str, model: dict[str, Any]) -> list[FieldError]:
    what = (
        "whose fused qkv_proj/gate_up_proj the tensor-parallel plan cannot shard"
        if architecture in HF_CLASS_WITHOUT_TP
        else "which the family's tensor-parallel plan (native class only) cannot shard"
    )
    chosen = [
        ("model.force_hf", bool(model.get("force_hf"))),
        ("model.attn_implementation", model.get("attn_implementation") not in _NATIVE_ATTENTION),
    ]
    return [
        FieldError(
            loc,
            f"loads the Hugging Face {architecture}, {what}",
            f"remove {loc.split('.')[-1]} or set distributed.tp_size: 1",
        )
        for loc, hf_class in chosen
        if hf_class
    ]


def expert_parallel_config_errors(
    config: dict[str, Any] | None, distributed: dict[str, Any], model: dict[str, Any] | None = None
) -> list[FieldError]:
    """Settings that leave an expert-parallel architecture without native grouped experts
    to spread: a quantized checkpoint (`quantization_config`, e.g. gpt-oss's MXFP4), and
    the Hugging Face class (`force_hf`, another `attn_implementation`). The family's plan
    refuses the same in the trainer."""
    architecture = architecture_of(config) if config else None
    if not architecture or int(distributed.get("ep_size") or 1) == 1:
        return []
    if not capabilities_for(architecture).supports_ep:
        return []  # capability_errors already refuses ep for this architecture
    model = model or {}
    attn = model.get("attn_implementation")
    hf_class = "loads the Hugging Face class, whose experts expert parallelism cannot spread"
    refusals = [
        (
            "distributed.ep_size",
            bool(config.get("quantization_config")),
            "the checkpoint is quantized (quantization_config): no native grouped experts to spread",
            "use a dequantized (bf16) checkpoint or set distributed.ep_size: 1",
        ),
        (
            "model.force_hf",
            bool(model.get("force_hf")),
            f"force_hf {hf_class}",
            "remove force_hf or set distributed.ep_size: 1",
        ),
        (
            "model.attn_implementation",
            attn not in _NATIVE_ATTENTION,
            f"attn_implementation {shown(attn)} {hf_class}",
            "remove attn_implementation or set distributed.ep_size: 1",
        ),
    ]
    return [FieldError(loc, msg, fix) for loc, refused, msg, fix in refusals if refused]


def _sliding_window(config: dict[str, Any]) -> bool:
    if "use_sliding_window" in config:
        return bool(config["use_sliding_window"])
    layer_types = config.get("layer_types") or []
    return config.get("sliding_window") is not None or "sliding_attention" in layer_types


def _unknown_architecture_errors(distributed: dict[str, Any]) -> list[FieldError]:
    fix = (
        "point model.pretrained_model_name_or_path at a local directory, put the model in the "
        "server's Hugging Face cache, or set {key}: 1"
    )
    return [
        FieldError(
            f"distributed.{key}",
            f"{what} depends on the architecture, and the model's config.json is not readable here",
            fix.format(key=f"distributed.{key}"),
        )
        for key, _, what in _CAPABILITY_FIELDS
        if int(distributed.get(key) or 1) > 1
    ]


def capability_errors(
    architecture: str | None, distributed: dict[str, Any], peft_enabled: bool
) -> list[FieldError]:
    """One error per parallelism the architecture cannot run (HF fallback: data parallel).

    When the model's config cannot be read here (a hub model not in the API's cache), a
    model-parallel size cannot be checked, so it is refused rather than left to the worker.
    """
    if architecture is None:
        return _unknown_architecture_errors(distributed)
    caps: ModelCapabilities = capabilities_for(architecture)
    architecture = clip(architecture, QUOTE_MAX)  # config.json's name, quoted in the errors
    errors = []
    for size_field, flag, what in _CAPABILITY_FIELDS:
        if int(distributed.get(size_field) or 1) > 1 and not getattr(caps, flag):
            errors.append(
                FieldError(
                    f"distributed.{size_field}",
                    f"{architecture} does not support {what}",
                    f"set distributed.{size_field}: 1",
                )
            )
    if distributed.get("sequence_parallel") and not caps.supports_sequence_parallel:
        errors.append(
            FieldError(
                "distributed.sequence_parallel",
                f"{architecture} does not support sequence parallelism",
                "set distributed.sequence_parallel: false",
            )
        )
    if distributed.get("strategy") == "fsdp2" and not caps.supports_fsdp:
        errors.append(
            FieldError(
                "distributed.strategy",
                f"{architecture} cannot be sharded with FSDP",
                "set distributed.strategy: ddp",
            )
        )
    if peft_enabled and not caps.supports_lora:
        errors.append(
            FieldError("peft", f"{architecture} does not support LoRA", "remove the peft section")
        )
    return errors + lora_tensor_parallel_errors(architecture, distributed, peft_enabled)
