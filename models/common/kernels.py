"""The model loader's kernel options: Liger's fused kernels and the SDPA backend choice.

`use_liger_kernel` swaps in Liger's Triton kernels where they compute what the model
already does: on tuneyard's native models the common `RMSNorm` (Llama casting, weight 1x)
becomes `LigerRMSNorm`, a SiLU `SwiGLUMLP` becomes `LigerSwiGLUMLP` (the same projection
modules, so parameter names, LoRA targets and parallel plans are unchanged) and full-width
RoPE runs `liger_rotary_pos_emb`; a Hugging Face class gets liger's own
`apply_liger_kernel_to_<model_type>(model=...)`. Liger's fused linear cross-entropy is not
used: the trainer computes the loss from the logits with the recipe's `loss_fn`.
`use_sdpa_patching` runs every decoder layer under `torch.nn.attention.sdpa_kernel` with
the backends of `sdpa_method` (default: cuDNN, flash, memory-efficient, math) on CUDA; a
Hugging Face class is also built with `attn_implementation="sdpa"` unless the recipe
chose another (`hf_attention`). Nothing here raises for a kernel reason: an option that
cannot apply (no CUDA, liger not importable, a model liger has no patch for) leaves the
model's own layers in place and is recorded on the model as `tuneyard_kernel_fallbacks`,
(option, reason) pairs the trainer reports once each as a `kernel_fallback` event.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from models.common.parallelize import _layers_prefix

log = logging.getLogger(__name__)

LIGER_MODULE = "liger_kernel.transformers"
# AutoModel's default sdpa_method, in its order.
DEFAULT_SDPA_METHOD = ("cudnn_attention", "flash_attention", "efficient_attention", "math")
OPTION_KEYS = ("use_liger_kernel", "use_sdpa_patching", "sdpa_method")
# What liger's apply_liger_kernel_to_<model_type> is asked for: the loss is not the model's.
_HF_LIGER_FLAGS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


@dataclass(frozen=True)
class KernelOptions:
    """The loader's kernel keywords; validation typed them (strict bools, backend names)."""

    use_liger_kernel: bool = False
    use_sdpa_patching: bool = False
    sdpa_method: tuple[str, ...] | None = None

    @property
    def any(self) -> bool:
        return self.use_liger_kernel or self.use_sdpa_patching


def pop_kernel_options(kwargs: dict[str, Any]) -> KernelOptions:
    """Take the kernel keywords out of a loader's kwargs (the rest go to the model)."""
    method = kwargs.pop("sdpa_method", None)
    return KernelOptions(
        use_liger_kernel=bool(kwargs.pop("use_liger_kernel", False)),
        use_sdpa_patching=bool(kwargs.pop("use_sdpa_patching", False)),
        sdpa_method=tuple(str(m).lower() for m in method) if method else None,
    )


def hf_attention(options: KernelOptions, attn_implementation: str | None) -> str | None:
    """The attn_implementation a Hugging Face class is built with: sdpa under
    `use_sdpa_patching` when the recipe chose none, else the recipe's choice."""
    if options.use_sdpa_patching and attn_implementation is None:
        return "sdpa"
    return attn_implementation


def default_device_type() -> str:
    """Where training will run: the trainer uses CUDA whenever it is available."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_kernel_options(
    model: nn.Module,
    options: KernelOptions,
    device_type: str | None = None,
    fallbacks: list[tuple[str, str]] | None = None,
) -> nn.Module:
    """Apply `options` to a built model in place; record what applied and what fell back.

    `model.tuneyard_kernels` lists what was swapped or patched; `fallbacks` (reasons found
    before the model was built, e.g. an HF class without sdpa) are kept with the new ones.
    """
    device_type = device_type or default_device_type()
    applied: list[str] = []
    fallbacks = list(fallbacks or [])
    if options.use_liger_kernel:
        reason = _apply_liger(model, device_type, applied)
        if reason:
            fallbacks.append(("use_liger_kernel", reason))
    sdpa_fell_back = any(option == "use_sdpa_patching" for option, _ in fallbacks)
    if options.use_sdpa_patching and not sdpa_fell_back:  # one report per option
        reason = _patch_sdpa(model, options.sdpa_method or DEFAULT_SDPA_METHOD, device_type)
        if reason:
            fallbacks.append(("use_sdpa_patching", reason))
        else:
            applied.append(
                "sdpa_kernel(" + ", ".join(options.sdpa_method or DEFAULT_SDPA_METHOD) + ")"
            )
    for option, reason in fallbacks:
        log.warning("%s fell back: %s", option, reason)
    model.tuneyard_kernels = applied
    model.tuneyard_kernel_fallbacks = fallbacks
    return model


def kernel_fallbacks(model: nn.Module) -> list[tuple[str, str]]:
    """The (option, reason) pairs a loaded model recorded (a PEFT wrapper's base too)."""
    found = getattr(model, "tuneyard_kernel_fallbacks", None)
    if found is None and hasattr(model, "get_base_model"):
        found = getattr(model.get_base_model(), "tuneyard_kernel_fallbacks", None)
    return list(found or [])


# --- Liger ------------------------------------------------------------------------------
def _import_liger() -> tuple[Any, str | None]:
    try:
        return importlib.import_module(LIGER_MODULE), None
    except Exception as exc:  # noqa: BLE001 - missing, or its Triton import failing
        return None, f"liger_kernel cannot be imported ({type(exc).__name__}: {exc})"


def _apply_liger(model: nn.Module, device_type: str, applied: list[str]) -> str | None:
    if device_type != "cuda":
        return (
            f"training runs on {device_type} and Liger's Triton kernels need CUDA; "
            "the model's own layers run"
        )
    liger, reason = _import_liger()
    if liger is None:
        return f"{reason}; the model's own layers run (pip install liger-kernel on the worker)"
    try:
        if getattr(model, "tuneyard_backend", None) == "native":
            applied += swap_native_modules(model, liger)
        else:
            applied += apply_liger_to_hf(model, liger)
    except Exception as exc:  # noqa: BLE001 - reported as the fallback, never a crash
        return f"Liger could not patch {type(model).__name__} ({type(exc).__name__}: {exc})"
    return None


def swap_native_modules(model: nn.Module, liger: Any) -> list[str]:
    """Replace the native common layers by liger's; every replacement is built before any
    is installed, so a failure leaves the model untouched. Returns what was replaced."""
    from models.common.layers import Attention, RMSNorm, SwiGLUMLP

    plan: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is RMSNorm:
                plan.append((parent, name, _liger_rms_norm(child, liger)))
            elif type(child) is SwiGLUMLP and child.act_fn is F.silu:
                plan.append((parent, name, _liger_swiglu(child, liger)))
    rotary = _liger_rotary(liger.liger_rotary_pos_emb)
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    for parent, name, new in plan:
        setattr(parent, name, new)
    for attention in attentions:
        attention.rotary_fn = rotary
    counts: dict[str, int] = {}
    for _, _, new in plan:
        counts[type(new).__name__] = counts.get(type(new).__name__, 0) + 1
    if attentions:
        counts["liger_rotary_pos_emb"] = len(attentions)
    return [f"{name} x{count}" for name, count in counts.items()]


def _liger_rms_norm(norm: nn.Module, liger: Any) -> nn.Module:
    with torch.device("meta"):  # its own weight is discarded: the model's is kept
        new = liger.LigerRMSNorm(
            norm.weight.shape[0], eps=norm.variance_epsilon, offset=0.0, casting_mode="llama"
        )
    new.weight = norm.weight
    return new


def _liger_swiglu(mlp: nn.Module, liger: Any) -> nn.Module:
    gate = mlp.gate_proj
    config = SimpleNamespace(
        hidden_size=gate.in_features, intermediate_size=gate.out_features, hidden_act="silu"
    )
    with torch.device("meta"):  # its projections are replaced by the model's own
        new = liger.LigerSwiGLUMLP(config)
    new.gate_proj, new.up_proj, new.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    return new


def _liger_rotary(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """Liger's RoPE where cos/sin cover the whole head; partial rotary keeps tuneyard's."""
    from models.common.rope import apply_rotary

    def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        if cos.shape[-1] != q.shape[-1]:
            return apply_rotary(q, k, cos, sin)
        return kernel(q, k, cos, sin)

    return rotate


def apply_liger_to_hf(model: nn.Module, liger: Any) -> list[str]:
    """liger's `apply_liger_kernel_to_<model_type>` on this instance (its modules patched)."""
    model_type = str(getattr(getattr(model, "config", None), "model_type", "") or "")
    name = f"apply_liger_kernel_to_{model_type}"
    patch = getattr(liger, name, None) if model_type else None
    if patch is None:
        raise LookupError(f"liger_kernel has no {name} for model_type {model_type!r}")
    accepted = inspect.signature(patch).parameters
    if "model" not in accepted:
        raise LookupError(f"{name} cannot patch a built model (no model= argument)")
    patch(model=model, **{k: v for k, v in _HF_LIGER_FLAGS.items() if k in accepted})
    return [name]


# --- SDPA -------------------------------------------------------------------------------
def sdpa_backends(names: tuple[str, ...]) -> list[Any]:
    from torch.nn.attention import SDPBackend

    return [getattr(SDPBackend, name.upper()) for name in names]


def _patch_sdpa(model: nn.Module, names: tuple[str, ...], device_type: str) -> str | None:
    hf_sdpa = getattr(model, "tuneyard_backend", None) == "hf" and _hf_attn(model) == "sdpa"
    chosen = "; attn_implementation sdpa is selected" if hf_sdpa else ""
    if device_type != "cuda":
        return (
            f"training runs on {device_type}: the SDPA backend choice (sdpa_method) applies "
            f"on CUDA only, and torch picks its {device_type} kernel{chosen}"
        )
    if getattr(model, "tuneyard_backend", None) == "hf" and _hf_attn(model) != "sdpa":
        return f"the model attends with {_hf_attn(model)!r}, not SDPA; nothing to patch"
    try:
        backends = sdpa_backends(names)
    except AttributeError as exc:  # a name this torch lacks: validation knows torch 2.13's
        return f"torch has no SDPA backend {exc.name or exc}; SDPA picks its own kernel"
    for layer in decoder_layers(model) or [model]:
        _run_under_sdpa_kernel(layer, backends)
    return None


def _hf_attn(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder `layers` ModuleList the parallel plans use (empty when there is none)."""
    found = _layers_prefix(model)
    return list(found[1]) if found else []


def _run_under_sdpa_kernel(module: nn.Module, backends: list[Any]) -> None:
    """Wrap one layer's forward (an activation-checkpoint recompute goes through it too).

    Bound to the layer as a method, so a deep copy of the model (a pipeline split) rebinds
    it to the copy rather than calling the original layer."""
    from torch.nn.attention import sdpa_kernel

    inner = module.forward.__func__  # the function this layer's forward runs now

    @functools.wraps(inner)
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with sdpa_kernel(backends):
            return inner(self, *args, **kwargs)

    module.forward = types.MethodType(forward, module)
