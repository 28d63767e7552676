"""Checks every native model family's tests make, written once.

A few AdamW steps on one batch (every trainable parameter gets a gradient); all-linear
LoRA through the trainer's `apply_peft` trains only the adapters, keeps the base weights
bit-equal, and its saved adapter applied with PEFT to the transformers class gives the
native logits; a native save round-trips a transformers checkpoint tensor for tensor and
transformers reloads it to the same logits; the one-rank gloo mesh and FSDP2 wrapping of
the shard-only-load tests. Each family test passes its own tiny config, batch and bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch


def fixed_batch(vocab: int, batch: int = 4, seq: int = 24, seed: int = 1) -> torch.Tensor:
    """Token ids in [1, vocab) drawn after `torch.manual_seed(seed)`."""
    torch.manual_seed(seed)
    return torch.randint(1, vocab, (batch, seq))


def train_losses(
    model: torch.nn.Module,
    ids: torch.Tensor,
    steps: int = 8,
    lr: float = 3e-3,
    nonzero_grads: bool = False,
) -> list[float]:
    """AdamW steps on one batch (labels = inputs); after every backward each trainable
    parameter has a gradient (with `nonzero_grads`, one that is not all zeros)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    losses: list[float] = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        missing = [
            name
            for name, p in model.named_parameters()
            if p.requires_grad
            and (p.grad is None or (nonzero_grads and not bool(p.grad.abs().sum() > 0)))
        ]
        assert not missing, missing
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def assert_lora_trains_adapters_and_applies_to_hf(
    base_dir: Path,
    adapter_dir: Path,
    ids: torch.Tensor,
    compare_ids: torch.Tensor,
    steps: int,
    lr: float,
) -> list[str]:
    """All-linear LoRA on the native load of `base_dir`: only `lora_` parameters train, the
    loss falls by 0.1, the base weights stay bit-equal, and the adapter saved to
    `adapter_dir`, applied with PEFT to transformers' class over `base_dir`, gives the
    native logits on `compare_ids`. Returns the trainable parameter names."""
    import transformers
    from peft import PeftModel

    from jobs.recipe.typed import Peft
    from models import AutoModelForCausalLM
    from trainer.builders import apply_peft

    native = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    assert native.tuneyard_backend == "native"
    base = {n: p.detach().clone() for n, p in native.named_parameters()}
    model = apply_peft(native, Peft(None, None, True, 8, 16.0, 0.0, "post", False, False))
    model.train()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    losses = train_losses(model, ids, steps=steps, lr=lr)
    assert losses[-1] < losses[0] - 0.1, losses
    for name, param in native.named_parameters():
        if "lora_" not in name and name in base:
            assert torch.equal(param, base[name]), name
    model.save_pretrained(adapter_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    reference = PeftModel.from_pretrained(reference, adapter_dir).eval()
    torch.testing.assert_close(
        model.eval()(input_ids=compare_ids).logits,
        reference(input_ids=compare_ids).logits,
        atol=1e-5,
        rtol=0,
    )
    return trainable


def assert_logits_and_loss_match(
    hf: torch.nn.Module,
    native: torch.nn.Module,
    ids: torch.Tensor,
    masked: int = 0,
    atol: float = 1e-5,
    rtol: float = 0.0,
) -> None:
    """Logits and loss equal transformers' (labels = ids, the first `masked` labels of row 0
    ignored)."""
    labels = ids.clone()
    labels[0, :masked] = -100
    ref, out = hf(input_ids=ids, labels=labels), native(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, ref.logits, atol=atol, rtol=rtol)
    torch.testing.assert_close(out.loss, ref.loss, atol=atol, rtol=rtol)


def assert_padded_logits_match(
    hf: torch.nn.Module,
    native: torch.nn.Module,
    ids: torch.Tensor,
    atol: float = 1e-5,
    rtol: float = 0.0,
) -> None:
    """Row 1 left-padded by 5 tokens: the logits equal transformers' on the real tokens."""
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ref = hf(input_ids=ids, attention_mask=mask).logits
    out = native(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], atol=atol, rtol=rtol)


def assert_registry_row_agrees(architecture: str, family: str, model_type: str) -> tuple:
    """The registry row of `architecture` imports, names its family and model type (and is
    the row found for that type), and is its class's only statement of capabilities, tie
    support and state-dict adapter (the class declares none of them). Returns (entry, class)."""
    from models import registry

    entry = registry.get_entry(architecture)
    assert entry is not None and registry.import_failures().get(architecture) is None
    cls = registry.load_class(entry)
    assert cls.architecture == entry.architecture == architecture and entry.family == family
    assert_class_declares_no_capabilities(cls)
    assert cls.registry_row() is entry and cls.tie_support() is entry.tie_support
    assert entry.config_model_types == (model_type,)
    assert registry.entry_for_model_type(model_type) is entry
    assert registry.load_state_dict_adapter(entry) is cls.state_dict_adapter()
    return entry, cls


ROW_FIELDS = (
    "capabilities",
    "get_capabilities",
    "tie_word_embeddings_support",
    "state_dict_adapter",
    "supports_tp",
)


def assert_class_declares_no_capabilities(cls: type) -> None:
    """The registry row is the one capability table: no class in the MRO restates it."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("models."):
            stated = {k for k in ROW_FIELDS if k in vars(klass)}
            stated -= {"state_dict_adapter"} if klass.__name__ == "NativeCausalLM" else set()
            assert not stated, f"{klass.__name__} restates {sorted(stated)}: the row says it"


def read_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors file in a saved model directory."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(path))
    return out


def assert_same_tensors(expected_dir: Path, actual_dir: Path) -> dict[str, torch.Tensor]:
    """Two saved directories hold the same tensors: names, dtypes, shapes and values.
    Returns `actual_dir`'s tensors."""
    before, after = read_safetensors_dir(expected_dir), read_safetensors_dir(actual_dir)
    assert sorted(before) == sorted(after)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and after[key].shape == tensor.shape, key
        assert torch.equal(after[key], tensor), key
    return after


def assert_save_round_trips_and_reloads(
    hf_dir: Path, native_dir: Path, native_class: type, ids: torch.Tensor, atol: float
) -> torch.nn.Module:
    """The native load of the transformers checkpoint `hf_dir` is `native_class`; its sharded
    save to `native_dir` holds the same tensors (names, dtypes, values), which transformers
    reloads to the native logits on `ids`. Returns the native model."""
    import transformers

    from models import AutoModelForCausalLM

    native = AutoModelForCausalLM.from_pretrained(hf_dir)
    assert type(native) is native_class
    native.save_pretrained(native_dir, max_shard_size=100_000)
    assert_same_tensors(hf_dir, native_dir)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(native_dir).eval()
    torch.testing.assert_close(
        native(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=atol, rtol=0
    )
    return native


def one_rank_gloo_mesh() -> Iterator[object]:
    """A 1-rank gloo process group and its CPU device mesh (use as a module fixture)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def shard_layers_then_model(model: torch.nn.Module, mesh: object) -> None:
    """FSDP2 on every decoder layer, then on the root, as the trainer wraps."""
    from torch.distributed.fsdp import fully_shard

    from models.hooks import decoder_layers

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
