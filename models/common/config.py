"""What a model load resolves before it builds anything: dtype, directory, config, class.

`resolve_dtype` reads the recipe's `dtype`/`torch_dtype` (a name, a torch.dtype, or
"auto" for the checkpoint's own, which `config_dtype` reads from the config);
`resolve_model_dir` turns a path or a hub id into a local directory, through the Hugging
Face cache only (offline, `local_files_only`); `load_config` returns a transformers config
from a config object, a dict with `model_type`, or a model directory; `native_class_for`
looks the config's architecture up in `models.registry` and returns the native class when
its row imports and the class accepts the config. Bad input raises `ModelLoadError`, which
names the recipe field and the fix. The loader (`AutoModelForCausalLM`) and the shard-only
load (`models.common.shard_load`) both start here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from models import registry

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

# The attention implementations a native class runs (None: the default, sdpa).
NATIVE_ATTENTION = (None, "sdpa", "eager")


class ModelLoadError(ValueError):
    """Bad model input: says which argument is wrong and how to fix it."""

    def __init__(self, field: str, msg: str, fix: str) -> None:
        super().__init__(f"{field}: {msg}; {fix}")
        self.field, self.msg, self.fix = field, msg, fix


def resolve_dtype(dtype: Any = None, torch_dtype: Any = None) -> torch.dtype | str | None:
    """A torch.dtype, the string "auto" (checkpoint dtype), or None (float32 default)."""
    value = dtype if dtype is not None else torch_dtype
    if value is None or isinstance(value, torch.dtype):
        return value
    text = str(value).removeprefix("torch.").lower()
    if text == "auto":
        return "auto"
    if text not in _DTYPES:
        raise ModelLoadError(
            "model.dtype",
            f"unknown dtype {value!r}",
            "use one of float32, bfloat16, float16, auto",
        )
    return _DTYPES[text]


def config_dtype(config: Any) -> torch.dtype:
    """The dtype the config says its checkpoint was saved in (float32 when it says none)."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    return _DTYPES.get(str(value or "float32").removeprefix("torch."), torch.float32)


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """A local directory, or a hub id already in the Hugging Face cache (never downloads)."""
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir():
        return path
    text = str(name_or_path)
    if path.exists() or text.count("/") != 1 or text.startswith((".", "/", "~")):
        raise ModelLoadError(
            "model.pretrained_model_name_or_path",
            f"{text!r} is not a model directory",
            "give a local directory holding config.json and *.safetensors, or a hub id "
            "already in the Hugging Face cache",
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any cache miss is the same user error
        raise ModelLoadError(
            "model.pretrained_model_name_or_path",
            f"hub id {text!r} is not in the local Hugging Face cache ({type(exc).__name__})",
            "download it beforehand (huggingface-cli download) or give a local directory",
        ) from exc


def load_config(config: Any, trust_remote_code: bool = False) -> Any:
    """A transformers config from a config object, a dict with `model_type`, or a path."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    if isinstance(config, dict):
        values = dict(config)
        model_type = values.pop("model_type", None)
        if not model_type:
            raise ModelLoadError(
                "model.config",
                "the config dict has no model_type",
                "add model_type (e.g. llama, qwen2, qwen3, qwen3_moe)",
            )
        try:
            return AutoConfig.for_model(model_type, **values)
        except ValueError as exc:
            raise ModelLoadError(
                "model.config.model_type", str(exc), "use a model_type transformers knows"
            ) from exc
    directory = resolve_model_dir(config)
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            "model.pretrained_model_name_or_path",
            f"{directory} has no config.json",
            "point at a model directory",
        )
    return AutoConfig.from_pretrained(
        directory, local_files_only=True, trust_remote_code=trust_remote_code
    )


def native_class_for(
    config: Any, attn_implementation: str | None = None
) -> tuple[type | None, str]:
    """The native class for a config and why (or why not) it was chosen."""
    if attn_implementation not in NATIVE_ATTENTION:
        return None, f"attn_implementation {attn_implementation!r} (native runs sdpa)"
    architectures = list(getattr(config, "architectures", None) or [])
    entry = next((registry.get_entry(a) for a in architectures if registry.get_entry(a)), None)
    if entry is None and not architectures:
        entry = registry.entry_for_model_type(getattr(config, "model_type", ""))
    if entry is None:
        return None, f"architecture {architectures or config.model_type} is not registered"
    try:
        cls = registry.load_class(entry)
    except Exception as exc:  # noqa: BLE001 - reported, then Hugging Face is used
        log.warning("native %s failed to import (%s); using transformers", entry.architecture, exc)
        return None, f"native {entry.architecture} failed to import: {exc}"
    reason = cls.unsupported_reason(config)
    if reason:
        return None, f"native {entry.architecture} does not support this config: {reason}"
    return cls, f"native {entry.architecture}"
