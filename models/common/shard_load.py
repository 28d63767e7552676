"""Shard-only loading: a native model built on `meta`, sharded, then filled tensor by tensor.

Loading a whole model on every rank and then sharding it costs each rank several times the
model's bytes. Here the native class is built on the meta device (`build_meta_native`, the
same config checks as `from_pretrained`), the caller applies its parallelize (TP, FSDP2) so
the parameters are meta DTensors, and `fill_sharded` allocates only the local shards
(`to_empty`), then reads each checkpoint tensor whole into one temporary, keeps this rank's
piece of it (`distribute_tensor` without communication: every rank read the same bytes) and
drops it. At most one full tensor exists at a time. Non-persistent buffers (rotary
`inv_freq`) are recomputed after `to_empty`; tied embeddings stay one parameter, so the
checkpoint's single tensor fills both.

Only families whose state-dict adapter writes each checkpoint tensor to a whole parameter
can take this path: no adapter (Hugging Face layout) or one declaring
`supports_low_memory_dcp_load = True`. Others (Qwen3-MoE, whose per-expert targets are
views into a grouped parameter, not into a sharded DTensor's storage) keep the full load.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor, distribute_tensor

from models.common.causal_lm import NativeCausalLM
from models.common.config import load_config, native_class_for, resolve_dtype, resolve_model_dir
from models.common.kernels import apply_kernel_options, pop_kernel_options
from models.common.rope import RotaryEmbedding
from models.common.safetensors_io import CheckpointError, SafetensorsReader

# the loader a recipe's `model._target_` (or any alias of it) resolves to
FROM_PRETRAINED_IMPORT = "models.auto:AutoModelForCausalLM.from_pretrained"


def supports_shard_only_load(cls: type) -> bool:
    """True when every load target of `cls` is a whole parameter (no layout conversion)."""
    if not (isinstance(cls, type) and issubclass(cls, NativeCausalLM)):
        return False
    adapter = cls.state_dict_adapter()
    return adapter is None or bool(getattr(adapter, "supports_low_memory_dcp_load", False))


def build_meta_native(
    pretrained_model_name_or_path: str | Path,
    dtype: Any = None,
    torch_dtype: Any = None,
    force_hf: bool = False,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> tuple[NativeCausalLM, Path] | None:
    """The native model of a `from_pretrained` call, on meta, and its checkpoint directory.

    None when `AutoModelForCausalLM.from_pretrained` would not build a native class this
    path can fill (Hugging Face fallback, `force_hf`, an adapter without the capability).
    """
    if force_hf:
        return None
    kwargs = dict(kwargs)
    options = pop_kernel_options(kwargs)
    directory = resolve_model_dir(pretrained_model_name_or_path)
    config = load_config(directory, trust_remote_code=trust_remote_code)
    native, _why = native_class_for(config, attn_implementation)
    if native is None or not supports_shard_only_load(native):
        return None
    resolved = resolve_dtype(dtype, torch_dtype)
    model = native.meta_from_pretrained(
        directory, dtype=resolved, attn_implementation=attn_implementation, **kwargs
    )
    model.tuneyard_backend = "native"
    return apply_kernel_options(model, options), directory  # swaps keep the meta weights


def _load_targets(model: NativeCausalLM) -> dict[str, torch.Tensor]:
    """Checkpoint key -> parameter, with activation-checkpoint wrapper names removed."""
    params = {n.replace(_CHECKPOINT_PREFIX, ""): p for n, p in model.named_parameters()}
    adapter = model.state_dict_adapter()
    if adapter is not None:
        return adapter.hf_targets(params, model.config)
    return params


def _local_piece(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of `full` under `param`'s placements (no communication)."""
    if not isinstance(param, DTensor):
        return full
    piece = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    return piece.to_local()


def _destination(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def iter_checked(
    reader: SafetensorsReader, model: NativeCausalLM, directory: Path
) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, target) pairs, once the checkpoint's keys match the model's exactly."""
    targets = _load_targets(model)
    model.check_checkpoint_keys(targets, set(reader.specs), directory)
    yield from targets.items()


@torch.no_grad()
def fill_sharded(model: NativeCausalLM, directory: Path, device: torch.device) -> None:
    """Allocate the (sharded) meta model's local storage on `device` and load `directory`."""
    model.to_empty(device=device)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_buffers()
    with SafetensorsReader(Path(directory)) as reader:
        for key, param in iter_checked(reader, model, Path(directory)):
            spec = reader.specs[key]
            if tuple(param.shape) != spec.shape:
                raise CheckpointError(
                    f"{key}: checkpoint shape {spec.shape} != model {tuple(param.shape)}"
                )
            full = torch.empty(spec.shape, dtype=param.dtype)
            reader.read_into(key, full)
            _destination(param).copy_(_local_piece(full.to(device), param))
            del full


def is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())
