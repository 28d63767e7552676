"""The base of every native causal LM: construction, weights in and out, loss, tie policy.

A family subclasses `NativeCausalLM`, calls the tie guard first in `__init__`, and passes
its backbone (`model.`). This base builds models on the meta device and materialises them
once (`_build_empty`), loads Hugging Face safetensors one tensor at a time straight into
the parameters (`load_hf_weights`, through the family's state-dict adapter when names or
layouts differ), writes them back as a directory `transformers` loads (`save_pretrained`),
and computes the same shifted cross-entropy as transformers.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from models import registry
from models.common.config import NATIVE_ATTENTION, config_dtype, resolve_dtype
from models.common.layers import _ACTIVATIONS, RMSNorm
from models.common.rope import RotaryEmbedding, rope_unsupported_reason
from models.common.safetensors_io import CheckpointError, SafetensorsReader, save_safetensors
from models.common.tie import reject_tie_word_embeddings_flip, tie_enabled
from models.registry import TieSupport

# Accepted when falsy (PEFT and the trainer pass them as None/False); native models keep no
# KV cache and do not return per-layer hidden states or attention maps.
_FALSY_FORWARD_KWARGS = ("use_cache", "output_attentions", "output_hidden_states", "cache")
_IGNORED_CHECKPOINT_KEYS = ("*.rotary_emb.inv_freq",)


class NativeCausalLM(nn.Module):
    """`model` (embeddings, layers, norm) + `lm_head`, with Hugging Face parameter names."""

    architecture: ClassVar[str] = ""  # its row in models.registry says what it supports
    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embed_tokens.weight"}
    _keep_in_fp32_modules_strict: ClassVar[list[str]] = []

    def __init__(self, config: Any, backbone: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.model = backbone
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    # --- the registry row -------------------------------------------------------------
    @classmethod
    def registry_row(cls) -> registry.ArchEntry:
        """This class's row: the one statement of its capabilities, tie support and adapter."""
        entry = registry.get_entry(cls.architecture)
        if entry is None:
            raise LookupError(
                f"{cls.__name__}: architecture {cls.architecture!r} has no row in "
                "models.registry; register one (registry.register)"
            )
        return entry

    @classmethod
    def tie_support(cls) -> TieSupport:
        return cls.registry_row().tie_support

    @classmethod
    def state_dict_adapter(cls) -> Any | None:
        """The row's state-dict adapter, or None when names match Hugging Face's."""
        return registry.load_state_dict_adapter(cls.registry_row())

    # --- config support -------------------------------------------------------------
    @classmethod
    def unsupported_reason(cls, config: Any) -> str | None:
        """Why this class cannot run the config natively (None when it can)."""
        reason = cls.rope_unsupported_reason(config)
        if reason:
            return reason
        if getattr(config, "hidden_act", "silu") not in _ACTIVATIONS:
            return f"hidden_act {config.hidden_act!r}"
        if config.num_attention_heads % (config.num_key_value_heads or 1):
            return "num_attention_heads is not a multiple of num_key_value_heads"
        return None

    @classmethod
    def rope_unsupported_reason(cls, config: Any) -> str | None:
        """Why the common RoPE cannot run the config (families with their own rotary override)."""
        return rope_unsupported_reason(config)

    # --- embeddings and tying -------------------------------------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value
        self.tie_weights()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def tie_weights(self) -> None:
        """Alias lm_head.weight to model.embed_tokens.weight when the policy/config ties them."""
        if tie_enabled(type(self), self.config):
            self.lm_head.weight = self.model.embed_tokens.weight

    # --- forward and loss -----------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        shift_labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        kwargs.pop("return_dict", None)
        unknown = {k for k, v in kwargs.items() if k not in _FALSY_FORWARD_KWARGS or v}
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward got unexpected arguments {sorted(unknown)}"
            )
        hidden = self.model(input_ids, attention_mask, position_ids, inputs_embeds)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.final_logits(self.lm_head(hidden))
        loss = None
        if labels is not None or shift_labels is not None:
            loss = causal_lm_loss(logits, labels, num_items_in_batch, shift_labels)
        return self._output(loss, logits, attention_mask)

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits the loss and the caller see (Gemma soft-caps them); as they are here."""
        return logits

    def _output(
        self, loss: torch.Tensor | None, logits: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> CausalLMOutputWithPast:
        """The forward's return value (families with auxiliary losses extend it)."""
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any
    ) -> dict[str, Any]:
        """Inputs for one decoding step: the whole sequence (native models keep no KV cache)."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 16, **_: Any) -> torch.Tensor:
        """Greedy decoding without a KV cache (each step reruns the sequence): for checks and
        demos; serve real generation with transformers or vLLM from the saved directory."""
        for _step in range(max_new_tokens):
            logits = self(**self.prepare_inputs_for_generation(input_ids), logits_to_keep=1).logits
            input_ids = torch.cat([input_ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return input_ids

    # --- construction ---------------------------------------------------------------
    @classmethod
    def _build_empty(cls, config: Any, dtype: torch.dtype) -> NativeCausalLM:
        """Construct on the meta device, cast, then allocate storage once (uninitialised)."""
        model = cls._build_meta(config, dtype)
        model.to_empty(device="cpu")
        model.tie_weights()
        for module in model.modules():
            if isinstance(module, RotaryEmbedding):
                module.reset_buffers()
        return model

    @classmethod
    def _build_meta(cls, config: Any, dtype: torch.dtype) -> NativeCausalLM:
        """Construct on the meta device in `dtype` (fp32 modules kept); no storage at all."""
        with torch.device("meta"):
            model = cls(config)
        model.to(dtype)
        model._restore_fp32_modules()
        return model

    def _restore_fp32_modules(self) -> None:
        """Modules, or single parameters (e.g. attention sinks), whose name ends with an
        entry of `_keep_in_fp32_modules_strict` go back to fp32."""
        patterns = [f"*{p}" for p in self._keep_in_fp32_modules_strict]
        for name, module in self.named_modules():
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                module.float()
        for name, param in self.named_parameters():
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                param.data = param.data.float()

    def init_weights(self) -> None:
        """Random initialisation as transformers does it (normal(0, initializer_range))."""
        std = float(getattr(self.config, "initializer_range", 0.02))
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, std)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, nn.Embedding):
                    module.weight.normal_(0.0, std)
                    if module.padding_idx is not None:
                        module.weight[module.padding_idx].zero_()
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)
                elif hasattr(module, "init_weights") and module is not self:
                    module.init_weights(std)
        self.tie_weights()

    @classmethod
    def from_config(
        cls, config: Any, dtype: Any = None, attn_implementation: str | None = None, **kwargs: Any
    ) -> NativeCausalLM:
        config = _with_overrides(config, kwargs)
        _check_supported(cls, config, attn_implementation)
        model = cls._build_empty(config, _dtype_or_default(dtype, config))
        model.init_weights()
        return model

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        dtype: Any = None,
        attn_implementation: str | None = None,
        **kwargs: Any,
    ) -> NativeCausalLM:
        directory = Path(directory)
        config = cls._pretrained_config(directory, attn_implementation, kwargs)
        model = cls._build_empty(config, _dtype_or_default(dtype, config))
        model.load_hf_weights(directory)
        return model.eval()

    @classmethod
    def meta_from_pretrained(
        cls,
        directory: str | Path,
        dtype: Any = None,
        attn_implementation: str | None = None,
        **kwargs: Any,
    ) -> NativeCausalLM:
        """`from_pretrained`'s model on the meta device, weights not read (shard-only load)."""
        config = cls._pretrained_config(Path(directory), attn_implementation, kwargs)
        return cls._build_meta(config, _dtype_or_default(dtype, config)).eval()

    @classmethod
    def _pretrained_config(
        cls, directory: Path, attn_implementation: str | None, overrides: dict[str, Any]
    ) -> Any:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        reject_tie_word_embeddings_flip(config, overrides, cls.__name__)
        config = _with_overrides(config, overrides)
        _check_supported(cls, config, attn_implementation)
        return config

    # --- Hugging Face weights in and out -------------------------------------------
    def hf_load_targets(self) -> dict[str, torch.Tensor]:
        """Checkpoint key -> the tensor (a parameter or a view of one) it is read into."""
        params = dict(self.named_parameters())  # tied lm_head is deduplicated away
        adapter = self.state_dict_adapter()
        if adapter is not None:
            return adapter.hf_targets(params, self.config)
        return params

    def load_hf_weights(self, directory: Path) -> None:
        """Read every tensor straight into its parameter; refuse missing or extra keys."""
        targets = self.hf_load_targets()
        with SafetensorsReader(directory) as reader:
            self.check_checkpoint_keys(targets, set(reader.specs), directory)
            reader.read_many(targets.items())
        self.tie_weights()

    def check_checkpoint_keys(
        self, targets: Mapping[str, Any], available: set[str], directory: Path
    ) -> None:
        """Refuse a checkpoint whose keys are not exactly the model's (ignorable ones aside)."""
        missing = sorted(set(targets) - available)
        extra = sorted(k for k in available - set(targets) if not self._ignorable(k))
        if missing or extra:
            raise CheckpointError(
                f"{directory}: checkpoint does not match {type(self).__name__}: "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}"
            )

    def _ignorable(self, key: str) -> bool:
        if key == "lm_head.weight" and tie_enabled(type(self), self.config):
            return True
        return any(fnmatch.fnmatch(key, p) for p in _IGNORED_CHECKPOINT_KEYS)

    def hf_state_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face key, tensor) pairs, without copies (views for split tensors)."""
        params = dict(self.named_parameters())
        adapter = self.state_dict_adapter()
        if adapter is not None:
            yield from adapter.to_hf(params, self.config).items()
        else:
            yield from params.items()

    def save_pretrained(
        self, directory: str | Path, max_shard_size: int = 5 * 2**30, **_: Any
    ) -> None:
        """config.json + safetensors (sharded past max_shard_size) that transformers loads."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(self.config)
        config.architectures = [self.architecture]
        config.dtype = self.model.embed_tokens.weight.dtype
        config.save_pretrained(directory)
        self.save_weights(directory, max_shard_size)

    def save_weights(self, directory: Path, max_shard_size: int) -> None:
        """The safetensors files of `save_pretrained` (a family whose Hugging Face tensors
        are built from several native ones overrides this to build them one at a time)."""
        save_safetensors(directory, self.hf_state_items(), max_shard_bytes=max_shard_size)


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    num_items_in_batch: int | torch.Tensor | None = None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next-token cross-entropy in fp32, -100 ignored; summed / num_items_in_batch if given."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    logits = logits.float().reshape(-1, logits.shape[-1])
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(
        logits, shift_labels.reshape(-1).to(logits.device), ignore_index=-100, reduction=reduction
    )
    return loss / num_items_in_batch if num_items_in_batch is not None else loss


def _with_overrides(config: Any, overrides: dict[str, Any]) -> Any:
    if not overrides:
        return config
    config = copy.deepcopy(config)
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise TypeError(f"unknown model argument {key!r} (not a {type(config).__name__} field)")
        setattr(config, key, value)
    return config


def _check_supported(cls: type[NativeCausalLM], config: Any, attn: str | None) -> None:
    reason = cls.unsupported_reason(config)
    if attn not in NATIVE_ATTENTION:
        reason = reason or f"attn_implementation {attn!r} (native uses sdpa)"
    if reason:
        raise ValueError(f"{cls.__name__} cannot run this config natively: {reason}")


def _dtype_or_default(dtype: Any, config: Any) -> torch.dtype:
    resolved = resolve_dtype(dtype)
    if resolved == "auto":
        return config_dtype(config)
    return resolved or torch.float32
