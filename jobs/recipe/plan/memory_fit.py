"""Refusing a job whose memory estimate cannot fit its device, with the cheapest fixes.

The estimate's per-rank total is compared with the device memory less `MEMORY_MARGIN`.
When it does not fit, the refusal sits at `distributed` and says the numbers; each fix is
one change re-estimated with the same memory model, ranked cheapest first: activation
checkpointing (recomputes, same result), a smaller micro-batch with more accumulation
(same global batch), more FSDP2 shards or tensor-parallel ranks (more devices), LoRA (a
different training). Only fixes that lower the estimate are offered (on CPU, LoRA's full
load or more ranks may not); those that fit come first; when none fits alone, the
combination of all is offered too. The same fixes are in `plan.estimate.fit` for clients that read JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.plan.estimate import MEMORY_MARGIN
from jobs.recipe.plan.memory_model import EstimateInputs, memory_per_rank

UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
SIZE = re.compile(r"\A\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*\Z", re.IGNORECASE)
ALL_LINEAR_LORA = {"dim": 8, "match_all_linear": True}


def parse_memory_size(text: str) -> int | None:
    """`80GiB`, `80GB`, `512MiB`, `1073741824` -> bytes (binary units); None if unreadable."""
    match = SIZE.match(str(text))
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2).lower()
    value = int(number * UNITS[unit])
    return value if value > 0 else None


@dataclass(frozen=True)
class Fix:
    change: str  # the recipe or resources setting, as a user writes it
    inputs: EstimateInputs
    cost: int  # rank: lower is cheaper

    @cached_property
    def total(self) -> int:  # read several times while ranking
        return memory_per_rank(self.inputs)["total"]


def _candidates(x: EstimateInputs, supports_tp: bool) -> list[Fix]:
    fixes = []
    if not x.activation_checkpointing or x.activation_checkpointing == "selective":
        fixes.append(
            Fix(
                "distributed.activation_checkpointing: true",
                replace(x, activation_checkpointing=True),
                0,
            )
        )
    if x.micro_batch > 1:
        half = x.micro_batch // 2
        fixes.append(
            Fix(
                f"dataloader.batch_size: {half} (grad_accumulation_steps doubles, "
                "same global batch)",
                replace(x, micro_batch=half),
                1,
            )
        )
    if x.strategy == "fsdp2":
        shards = x.dp_shard * 2
        fixes.append(
            Fix(
                f"twice the ranks: distributed.dp_shard_size: {shards}",
                replace(x, dp_shard=shards, world_size=x.world_size * 2),
                2,
            )
        )
    if supports_tp and x.strategy == "fsdp2":
        fixes.append(
            Fix(
                f"distributed.tp_size: {x.tp * 2} (twice the ranks)",
                replace(x, tp=x.tp * 2, world_size=x.world_size * 2),
                3,
            )
        )
    if x.lora_rank is None:  # every rank then loads the whole model
        lora = replace(x, lora_rank=8, trainable=_lora_trainable(x), full_load=True)
        fixes.append(Fix(f"peft: {ALL_LINEAR_LORA} (trains LoRA adapters only)", lora, 4))
    return fixes


def _lora_trainable(x: EstimateInputs) -> int:
    """Rank-8 adapters on every layer's projections: 8 x (in + out) per projection."""
    per_layer = 8 * (4 * x.hidden + 2 * x.attention_width + 3 * (x.hidden + x.mlp_width))
    return per_layer * x.layers


def ranked_fixes(x: EstimateInputs, usable: int, supports_tp: bool) -> list[dict[str, Any]]:
    """Each fix that lowers the per-rank total, with its new total; those that fit first,
    then by cost."""
    now = memory_per_rank(x)["total"]
    fixes = [f for f in _candidates(x, supports_tp) if f.total < now]
    if fixes and not any(f.total <= usable for f in fixes):
        combined = x
        for fix in fixes:
            combined = replace(combined, **_diff(x, fix.inputs))
        fixes.append(Fix("all of: " + "; ".join(f.change for f in fixes), combined, 9))
    fixes.sort(key=lambda f: (f.total > usable, f.cost))
    return [{"change": f.change, "total_bytes": f.total, "fits": f.total <= usable} for f in fixes]


def _diff(before: EstimateInputs, after: EstimateInputs) -> dict[str, Any]:
    return {k: v for k, v in vars(after).items() if getattr(before, k) != v}


def _gib(value: float) -> str:
    """GiB with two decimals; MiB below one GiB, where two decimals of GiB say too little."""
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


def fit_check(
    estimate: dict[str, Any] | None, device_memory: int, supports_tp: bool
) -> list[FieldError]:
    """The refusal at `distributed` when the estimate exceeds the usable device memory;
    records `fit` (device, usable, fits, fixes) in the estimate either way. The fixes are
    re-estimated from the inputs the estimate states in `basis.inputs`."""
    if estimate is None:
        return []
    inputs = EstimateInputs(**estimate["basis"]["inputs"])
    usable = int(device_memory * (1 - MEMORY_MARGIN))
    memory = estimate["memory_per_rank_bytes"]
    fits = memory["total"] <= usable
    fixes = [] if fits else ranked_fixes(inputs, usable, supports_tp)
    estimate["fit"] = {
        "device_memory_bytes": device_memory,
        "usable_bytes": usable,
        "margin": MEMORY_MARGIN,
        "fits": fits,
        "fixes": fixes,
    }
    if fits:
        return []
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in memory.items() if k != "total")
    msg = (
        f"the job needs an estimated {_gib(memory['total'])} per rank ({parts}); the "
        f"device has {_gib(device_memory)}, {_gib(usable)} usable after the "
        f"{MEMORY_MARGIN:.0%} margin"
    )
    ranked = "; ".join(
        f"{i}) {f['change']} -> {_gib(f['total_bytes'])}{'' if f['fits'] else ' (still too much)'}"
        for i, f in enumerate(fixes, 1)
    )
    fix = f"cheapest first: {ranked}" if ranked else "use a device with more memory"
    return [FieldError("distributed", msg, fix)]
