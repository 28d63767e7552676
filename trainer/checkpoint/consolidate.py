"""Consolidated Hugging Face checkpoints from a sharded model, one tensor at a time.

`save_consolidated_model` writes `model.safetensors` (or shards plus
`model.safetensors.index.json`), `config.json` and `generation_config.json`: a directory
`transformers` loads as is. Every rank walks the state dict in the same order; a DTensor
is gathered with `full_tensor()` (a collective, so all ranks take part), rank 0 writes its
bytes and drops it. No rank ever holds a full copy of the model. An asynchronous save
instead calls `snapshot_consolidated_model` (the same gathers, into private CPU copies on
rank 0) and `write_consolidated_snapshot` later, from a background thread. `save_lora_base_model`
writes the frozen base under a PEFT model the same way (LoRA tensors left out, names
unwrapped). `save_lora_adapter` writes a PEFT adapter (`adapter_model.safetensors` +
`adapter_config.json` naming its base model), gathering only the adapter's tensors. `load_model_weights` copies a consolidated
checkpoint back into an unsharded model, tensor by tensor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor

from models.common.moe.lora import ExpertLoraError, is_expert_lora
from models.common.safetensors_io import (
    CheckpointError,
    SafetensorsFileWriter,
    TensorEntry,
    iter_safetensors,
    plan_shards,
    read_tensors,
    shard_file_names,
    write_file,
    write_index,
)
from models.hooks import (
    from_hf_state_dict,
    has_state_dict_adapter,
    lora_adapter_from_hf,
    lora_adapter_to_hf,
    to_hf_group_tensors,
    to_hf_groups,
)
from trainer.errors import checkpoint_error

DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


Rename = Callable[[str], str | None]


def _unique_state(model: nn.Module, rename: Rename | None = None) -> list[tuple[str, torch.Tensor]]:
    """State dict entries with tied tensors kept once (the first name, as transformers does).

    Ties are read from the module tree (the same Parameter under two names), because a
    sharded model's `state_dict()` returns fresh DTensor objects for each name. `rename`
    maps each kept name to the one written, or to None to leave the tensor out.
    """
    first_name: dict[int, str] = {}
    duplicates: set[str] = set()
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        name = name.replace(_CHECKPOINT_PREFIX, "")
        if id(tensor) in first_name:
            duplicates.add(name)
        else:
            first_name[id(tensor)] = name
    items = [(n, t) for n, t in model.state_dict().items() if n not in duplicates]
    if rename is None:
        return items
    return [(new, t) for n, t in items if (new := rename(n)) is not None]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _hf_layout(
    model: nn.Module, items: list[tuple[str, torch.Tensor]]
) -> tuple[list[TensorEntry], dict[str, tuple[str, ...]]]:
    """Hugging Face entries in write order, and the native tensors each one comes from.

    The model's state-dict adapter (MoE experts: one grouped tensor -> one tensor per
    expert; Phi-3: q/k/v -> one fused tensor) is applied to meta tensors here, so the
    layout costs no memory.
    """
    entries: list[TensorEntry] = []
    source: dict[str, tuple[str, ...]] = {}
    tensors = dict(items)
    for group in to_hf_groups(model, list(tensors)):
        metas = {n: _meta(tensors[n]) for n in group}
        for hf_name, hf_tensor in to_hf_group_tensors(model, metas):
            entries.append(TensorEntry(hf_name, hf_tensor.dtype, tuple(hf_tensor.shape)))
            source[hf_name] = group
    return entries, source


def _meta(tensor: torch.Tensor) -> torch.Tensor:
    """A storage-free stand-in with the (global, for a DTensor) shape and dtype."""
    return torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")


def _full_group(
    model: nn.Module, group: tuple[str, ...], tensors: dict[str, Any]
) -> dict[str, Any]:
    """One group's Hugging Face tensors from its gathered natives (every rank gathers)."""
    return dict(to_hf_group_tensors(model, {n: _full(tensors[n]) for n in group}))


def write_shard_files(
    model: nn.Module,
    out_dir: Path,
    tensors: dict[str, Any],
    source: dict[str, tuple[str, ...]],
    files: Iterable[tuple[str, list[TensorEntry]]],
    writes: bool,
) -> None:
    """Gather the tensors file by file (every rank joins each gather, once per native
    group); a rank that `writes` writes the files."""
    gathered, converted = (), {}
    for file_name, shard in files:
        writer = SafetensorsFileWriter(out_dir / file_name, shard) if writes else None
        for entry in shard:
            group = source[entry.name]
            if group != gathered:
                converted = {}  # drop the previous full tensors before gathering the next
                converted = _full_group(model, group, tensors)
                gathered = group
            if writer is not None:
                writer.write(entry.name, converted[entry.name])
        if writer is not None:
            writer.close()


def save_consolidated_model(
    model: nn.Module,
    out_dir: Path,
    is_rank0: bool,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    generation_config: Any = None,
    rename: Rename | None = None,
) -> None:
    """Write `model` (plain, DDP-unwrapped, FSDP2 or TP) as a Hugging Face directory.

    `generation_config` is written as `generation_config.json`; without one, the model's
    own, else one derived from its config (so `GenerationConfig.from_pretrained` works).
    """
    items = _unique_state(model, rename)
    entries, source = _hf_layout(model, items)
    shards = plan_shards(entries, max_shard_bytes)
    tensors = dict(items)
    if is_rank0:
        out_dir.mkdir(parents=True, exist_ok=True)
    files = zip(shard_file_names(len(shards)), shards, strict=True)
    write_shard_files(model, out_dir, tensors, source, files, is_rank0)
    if is_rank0:
        write_index(out_dir, shards)
        _write_config(model, out_dir, entries, generation_config)


@dataclass
class ConsolidatedSnapshot:
    """A model's Hugging Face tensors copied to CPU memory on rank 0, ready to write.

    What an asynchronous save holds while the step loop goes on mutating the parameters:
    every tensor is a private copy, so the background write sees the weights of the step
    that was saved. Rank 0 holds the whole model here (the price of not blocking).
    """

    shards: list[list[TensorEntry]]
    tensors: dict[str, torch.Tensor]
    config: Any
    generation_config: Any


def _private_copy(native: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The full tensor, and whether it is already a fresh copy (a gather over >1 rank is)."""
    if isinstance(native, DTensor):
        return native.full_tensor(), native.device_mesh.size() > 1
    return native, False


def snapshot_consolidated_model(
    model: nn.Module,
    is_rank0: bool,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    generation_config: Any = None,
) -> ConsolidatedSnapshot | None:
    """Gather `model` into a `ConsolidatedSnapshot` on rank 0 (None elsewhere).

    Every rank joins each gather, in the order `save_consolidated_model` uses; nothing is
    written. `write_consolidated_snapshot` writes it later, from any thread.
    """
    items = _unique_state(model)
    entries, source = _hf_layout(model, items)
    natives, tensors = dict(items), {}
    for group in dict.fromkeys(source.values()):
        fulls = {n: _private_copy(natives[n].detach()) for n in group}
        fresh = all(f for _, f in fulls.values()) or len(group) > 1  # fused: built anew
        converted = to_hf_group_tensors(model, {n: full for n, (full, _) in fulls.items()})
        for hf_name, hf_tensor in converted:
            if is_rank0:
                private = fresh or hf_tensor.device.type != "cpu"  # .to("cpu") copies then
                tensors[hf_name] = hf_tensor.to("cpu") if private else hf_tensor.clone()
        del fulls, converted
    if not is_rank0:
        return None
    config = copy.deepcopy(getattr(model, "config", None))
    generation = copy.deepcopy(generation_config or getattr(model, "generation_config", None))
    return ConsolidatedSnapshot(plan_shards(entries, max_shard_bytes), tensors, config, generation)


def write_consolidated_snapshot(snapshot: ConsolidatedSnapshot, out_dir: Path) -> None:
    """Write what `snapshot_consolidated_model` gathered, as `save_consolidated_model` does."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = shard_file_names(len(snapshot.shards))
    for file_name, shard in zip(names, snapshot.shards, strict=True):
        writer = SafetensorsFileWriter(out_dir / file_name, shard)
        for entry in shard:
            writer.write(entry.name, snapshot.tensors[entry.name])
        writer.close()
    write_index(out_dir, snapshot.shards)
    entries = [entry for shard in snapshot.shards for entry in shard]
    _write_config_of(snapshot.config, out_dir, entries, snapshot.generation_config)


def _write_config(
    model: nn.Module, out_dir: Path, entries: list[TensorEntry], generation: Any
) -> None:
    generation = generation or getattr(model, "generation_config", None)
    _write_config_of(getattr(model, "config", None), out_dir, entries, generation)


def _write_config_of(
    config: Any, out_dir: Path, entries: list[TensorEntry], generation: Any
) -> None:
    if config is None:
        return
    float_dtypes = [e.dtype for e in entries if e.dtype.is_floating_point]
    if float_dtypes:
        config.dtype = float_dtypes[0]
    config.save_pretrained(out_dir)
    if generation is None:  # native classes carry none; derive it as transformers does
        from transformers import GenerationConfig

        generation = GenerationConfig.from_model_config(config)
    generation.save_pretrained(out_dir)


def _lora_base_name(name: str) -> str | None:
    """The base model's own name for a tensor of a LoRA-wrapped model; None for LoRA's."""
    if "lora_" in name or ".modules_to_save." in name:
        return None
    return name.replace(".base_layer.", ".").replace(".original_module.", ".")


def save_lora_base_model(
    peft_model: nn.Module, out_dir: Path, is_rank0: bool, generation_config: Any = None
) -> None:
    """The frozen base under a PEFT model, as a Hugging Face directory without LoRA tensors."""
    base = peft_model.get_base_model()
    save_consolidated_model(
        base, out_dir, is_rank0, generation_config=generation_config, rename=_lora_base_name
    )


def save_lora_adapter(
    peft_model: nn.Module, out_dir: Path, is_rank0: bool, base_model: str | None = None
) -> None:
    """A PEFT adapter dir from a (possibly sharded) PeftModel; gathers adapter tensors only.

    `base_model` is written as `base_model_name_or_path`, the model
    `AutoPeftModelForCausalLM` loads under the adapter.
    """
    gathered = gather_adapter_tensors(peft_model, keep=is_rank0)
    if is_rank0:
        write_lora_adapter(
            peft_model, peft_adapter_state(peft_model, gathered), out_dir, base_model
        )


def gather_adapter_tensors(peft_model: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The adapter's tensors (LoRA's and `modules_to_save`), whole, on the CPU; every rank
    joins each gather, and only a rank that `keep`s gets them back."""
    gathered: dict[str, torch.Tensor] = {}
    for name, tensor in peft_model.state_dict().items():
        if "lora_" in name or "modules_to_save" in name:
            full = _full(tensor)
            if keep:
                gathered[name] = full.detach().to("cpu").contiguous()
    return gathered


def peft_adapter_state(
    peft_model: nn.Module, gathered: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Gathered tensors under PEFT's saved names (the adapter name dropped). PEFT keeps
    only the tensors of modules `peft_model` holds: a pipeline stage converts its own.

    PEFT finds those modules by their names in the module tree, where an activation-
    checkpointed layer's sit under `_checkpoint_wrapped_module.` (its state dict drops
    that part): the tensors go to PEFT under their tree names, and come back without it.
    """
    from peft import get_peft_model_state_dict

    tree = {n.replace(_CHECKPOINT_PREFIX, ""): n for n, _ in peft_model.named_parameters()}
    in_tree = {tree.get(k, k): v for k, v in gathered.items()}
    selected = get_peft_model_state_dict(peft_model, state_dict=in_tree)
    state = {k.replace(_CHECKPOINT_PREFIX, ""): v for k, v in selected.items()}
    # expert adapters (`models.common.moe.lora`) are the model's own tensors, not peft's
    return {**state, **{k: v for k, v in gathered.items() if is_expert_lora(k)}}


def write_lora_adapter(
    peft_model: nn.Module,
    adapter: dict[str, torch.Tensor],
    out_dir: Path,
    base_model: str | None = None,
) -> None:
    """`adapter_model.safetensors` and `adapter_config.json` from an adapter state (PEFT's
    saved names), in the Hugging Face class's layout."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = copy.copy(peft_model.peft_config["default"])  # the live model's stays untouched
    adapter, config = lora_adapter_to_hf(peft_model, adapter, config)
    entries = [TensorEntry.of(name, tensor) for name, tensor in adapter.items()]
    write_file(out_dir / "adapter_model.safetensors", entries, adapter.items())
    config.base_model_name_or_path = base_model or config.base_model_name_or_path
    config.save_pretrained(str(out_dir))


def _checkpoint_tensors(model: nn.Module, directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the model's own names (streamed when no adapter)."""
    try:
        if not has_state_dict_adapter(model):
            yield from iter_safetensors(directory)
        else:
            yield from from_hf_state_dict(model, dict(iter_safetensors(directory))).items()
    except CheckpointError as exc:  # a malformed or missing file is the user's to fix
        raise checkpoint_error(str(exc)) from exc


def load_model_weights(model: nn.Module, directory: Path) -> None:
    """Copy a consolidated checkpoint into an unsharded model; any key mismatch is refused."""
    state = model.state_dict()
    expected = {name for name, _ in _unique_state(model)}
    found: set[str] = set()
    with torch.no_grad():
        for name, tensor in _checkpoint_tensors(model, directory):
            if name not in state:
                raise checkpoint_error(
                    f"{directory}: tensor {name} does not exist in the model; "
                    "the checkpoint is of another model"
                )
            if tuple(state[name].shape) != tuple(tensor.shape):
                raise checkpoint_error(
                    f"{directory}: {name} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(state[name].shape)}"
                )
            state[name].copy_(tensor)
            found.add(name)
    missing = sorted(expected - found)
    if missing:
        raise checkpoint_error(
            f"{directory}: missing {len(missing)} tensors (first: "
            f"{missing[0]}); the checkpoint is incomplete or of another model"
        )


def load_lora_adapter(peft_model: nn.Module, directory: Path) -> None:
    from peft import set_peft_model_state_dict

    file = directory / "adapter_model.safetensors"
    if not file.is_file():
        raise checkpoint_error(
            f"{directory} has no adapter_model.safetensors; it is not a "
            "LoRA checkpoint (was the run trained without peft?)"
        )
    try:
        adapter = dict(read_tensors(file))
    except CheckpointError as exc:
        raise checkpoint_error(str(exc)) from exc
    try:
        adapter = lora_adapter_from_hf(peft_model, adapter)
    except ExpertLoraError as exc:
        raise checkpoint_error(f"{file}: {exc}") from None
    _load_expert_adapters(peft_model, adapter, file)
    adapter = {k: v for k, v in adapter.items() if not is_expert_lora(k)}
    result: Any = set_peft_model_state_dict(peft_model, adapter)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise checkpoint_error(f"{file}: adapter tensors {unexpected[:3]} do not fit the model")


def _load_expert_adapters(
    peft_model: nn.Module, adapter: dict[str, torch.Tensor], file: Path
) -> None:
    """Copy the expert adapters of `adapter` into the model's own tensors; every expert
    adapter the model has must be there, with its shape."""
    params = {k: p for k, p in peft_model.named_parameters() if is_expert_lora(k)}
    saved = {k: v for k, v in adapter.items() if is_expert_lora(k)}
    if set(saved) != set(params):
        odd = sorted(set(saved) ^ set(params))
        raise checkpoint_error(
            f"{file}: expert adapter {odd[0]} is in only one of the checkpoint and the model; "
            "the recipe's peft targets differ from the run's"
        )
    with torch.no_grad():
        for name, tensor in saved.items():
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise checkpoint_error(
                    f"{file}: {name} has shape {tuple(tensor.shape)}, the model expects "
                    f"{tuple(params[name].shape)} (another peft.dim or moe_rank_scaling?)"
                )
            params[name].copy_(tensor)
