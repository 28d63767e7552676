"""Finding the causal LM under the wrappers training puts around it, by type.

`unwrap_model` peels `torch.compile`'s `OptimizedModule`, `DistributedDataParallel`, FSDP1's
`FullyShardedDataParallel` and PEFT's `PeftModel` / tuner (`LoraModel`) layers until it
reaches the model itself. FSDP2 (`fully_shard`) does not wrap: it swaps the module's class
for a subclass in place, so the sharded module is its own model and `isinstance` against
the family class still holds. Each wrapper is recognised with `isinstance` against its real
class; a wrapper class whose module was never imported cannot have wrapped anything, so
optional packages (peft) and heavy ones (dynamo) are only looked up in `sys.modules`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch import nn
from torch.nn.parallel import DistributedDataParallel

# Deeper nesting than compile(DDP(Peft(LoraModel(model)))) means a cycle, not a model.
_MAX_DEPTH = 8


def _loaded_class(module: str, name: str) -> type | None:
    """The class `module.name` if that module is already imported (else nothing to match)."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def _wrapper_rules() -> list[tuple[type, Callable[[nn.Module], nn.Module]]]:
    """(wrapper class, how to reach the module it wraps) for every wrapper class loaded."""
    rules: list[tuple[type | None, Callable[[nn.Module], nn.Module]]] = [
        (_loaded_class("torch._dynamo.eval_frame", "OptimizedModule"), lambda m: m._orig_mod),
        (DistributedDataParallel, lambda m: m.module),
        (
            _loaded_class(
                "torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel"
            ),
            lambda m: m.module,
        ),
        (_loaded_class("peft.peft_model", "PeftModel"), lambda m: m.base_model),
        (_loaded_class("peft.tuners.tuners_utils", "BaseTuner"), lambda m: m.model),
    ]
    return [(cls, inner) for cls, inner in rules if cls is not None]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module under every compile / DDP / FSDP1 / PEFT wrapper around `model`."""
    rules = _wrapper_rules()
    for _ in range(_MAX_DEPTH):
        inner = next((get(model) for cls, get in rules if isinstance(model, cls)), None)
        if inner is None:
            return model
        model = inner
    raise ValueError(f"{type(model).__name__}: wrappers nested deeper than {_MAX_DEPTH}")
