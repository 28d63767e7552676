"""The model loader: native class when the registry has one for the config, else Hugging Face.

`AutoModelForCausalLM.from_pretrained(path, dtype=...)` and `.from_config(config, ...)`
mirror the transformers entry points. They resolve the dtype, directory and config and
look the architecture up in `models.registry` (`models.common.config`), and build the
native class when the row imports and the class accepts the config
(`unsupported_reason(config)` returns None); otherwise, or with `force_hf=True`, they build
`transformers.AutoModelForCausalLM`. Paths are local directories, or hub ids resolved
through the Hugging Face cache only (offline, `local_files_only`). Which backend
was chosen is recorded on the model as `model.tuneyard_backend` ("native" or "hf").
The kernel keywords (`use_liger_kernel`, `use_sdpa_patching`, `sdpa_method`) are applied
to the built model by `models.common.kernels`, which falls back (recorded on the model,
never raised) where a kernel cannot run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from models.common import kernels
from models.common.config import (
    ModelLoadError,
    config_dtype,
    load_config,
    native_class_for,
    resolve_dtype,
    resolve_model_dir,
)
from models.common.safetensors_io import CheckpointError
from models.common.tie import TieWordEmbeddingsError, reject_tie_word_embeddings_flip

log = logging.getLogger(__name__)


def auto_config(pretrained_model_name_or_path: str | Path, **overrides: Any) -> Any:
    """`model.config: {_target_: transformers.AutoConfig.from_pretrained, ...}`: the config of
    a local or cached model with attribute overrides (`num_hidden_layers: 2`); no remote code
    (a config that needs it is refused at submit) and never a download."""
    config = load_config(pretrained_model_name_or_path)
    unknown = sorted(k for k in overrides if not hasattr(config, k))
    if unknown:
        raise ModelLoadError(
            f"model.config.{unknown[0]}",
            f"{type(config).__name__} has no attribute {unknown[0]!r}",
            "remove it or name an attribute of the model's config.json",
        )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _tag(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    model.tuneyard_backend = backend
    return model


class AutoModelForCausalLM:
    """Entry points only; never instantiated."""

    def __init__(self) -> None:
        raise TypeError("use AutoModelForCausalLM.from_pretrained or .from_config")

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        dtype: Any = None,
        torch_dtype: Any = None,
        force_hf: bool = False,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> torch.nn.Module:
        """Load weights from a local (or HF-cached) directory of safetensors."""
        options = kernels.pop_kernel_options(kwargs)
        directory = resolve_model_dir(pretrained_model_name_or_path)
        resolved = resolve_dtype(dtype, torch_dtype)
        config = load_config(directory, trust_remote_code=trust_remote_code)
        try:
            reject_tie_word_embeddings_flip(config, kwargs, str(directory))
        except TieWordEmbeddingsError as exc:
            raise ModelLoadError(
                "model.tie_word_embeddings",
                str(exc),
                "remove model.tie_word_embeddings from the recipe",
            ) from exc
        native, why = (
            (None, "force_hf") if force_hf else native_class_for(config, attn_implementation)
        )
        if native is not None:
            log.info("loading %s natively (%s)", directory, why)
            try:
                model = native.from_pretrained(
                    directory, dtype=resolved, attn_implementation=attn_implementation, **kwargs
                )
            except CheckpointError as exc:
                raise ModelLoadError(
                    "model.pretrained_model_name_or_path",
                    str(exc),
                    "point at a complete checkpoint saved for this architecture",
                ) from exc
            return kernels.apply_kernel_options(_tag(model, "native"), options)
        log.info("loading %s with transformers (%s)", directory, why)
        build = functools.partial(
            _hf_auto_class(config).from_pretrained,
            directory,
            dtype=resolved or torch.float32,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
        return _build_hf(build, options, attn_implementation)

    @classmethod
    def from_config(
        cls,
        config: Any,
        dtype: Any = None,
        torch_dtype: Any = None,
        force_hf: bool = False,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> torch.nn.Module:
        """Build a randomly initialised model from a config (object, dict or path)."""
        options = kernels.pop_kernel_options(kwargs)
        resolved = resolve_dtype(dtype, torch_dtype)
        config = load_config(config, trust_remote_code=trust_remote_code)
        if resolved == "auto":
            resolved = config_dtype(config)
        native, why = (
            (None, "force_hf") if force_hf else native_class_for(config, attn_implementation)
        )
        if native is not None:
            model = native.from_config(
                config, dtype=resolved, attn_implementation=attn_implementation, **kwargs
            )
            return kernels.apply_kernel_options(_tag(model, "native"), options)
        log.info("building %s with transformers (%s)", type(config).__name__, why)
        build = functools.partial(
            _hf_auto_class(config).from_config,
            config,
            dtype=resolved or torch.float32,
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
        return _build_hf(build, options, attn_implementation)


def _hf_auto_class(config: Any) -> Any:
    """transformers' causal-LM auto class, or for a multimodal checkpoint that has no
    causal-LM class (`Mistral3ForConditionalGeneration`: Mistral-Small-3.x) its
    image-text-to-text one, which runs on text alone (no pixel values)."""
    from transformers import AutoModelForCausalLM as CausalLM
    from transformers import AutoModelForImageTextToText as ImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return CausalLM
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return ImageTextToText
    return CausalLM  # its own error names the configuration class it cannot load


def freeze_outside_text(model: torch.nn.Module) -> torch.nn.Module:
    """Text-only fine-tuning of an image-text-to-text class: the vision tower and projector
    get no gradient from text, so they are frozen (no optimizer state, nothing to reduce);
    the language model and the output head train. Any other class is left as it is."""
    from transformers import AutoModelForImageTextToText

    if _hf_auto_class(model.config) is not AutoModelForImageTextToText:
        return model
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    if decoder is None:
        return model
    text = {id(p) for part in (decoder, head) if part is not None for p in part.parameters()}
    for parameter in model.parameters():
        if id(parameter) not in text:
            parameter.requires_grad_(False)
    return model


def _build_hf(
    build: Callable[..., torch.nn.Module], options: kernels.KernelOptions, attn: str | None
) -> torch.nn.Module:
    """The Hugging Face class, with sdpa under `use_sdpa_patching` when the recipe chose no
    attention; a class that cannot run sdpa is built with its default (a fallback)."""
    chosen = kernels.hf_attention(options, attn)
    fallbacks = []
    try:
        model = build(**({"attn_implementation": chosen} if chosen else {}))
    except ValueError as exc:
        if chosen == attn:  # the recipe's own choice: its error is the user's
            raise
        fallbacks.append(
            ("use_sdpa_patching", f"the class cannot run sdpa ({exc}); its default attention runs")
        )
        model = build()
    model = freeze_outside_text(model)
    return kernels.apply_kernel_options(_tag(model, "hf"), options, fallbacks=fallbacks)
