"""LoRA on grouped experts, in AutoModel's form (`GroupedExpertsLoRA`).

`add_expert_lora(experts, rank, alpha)` gives a `GroupedExperts` module four trainable
`[num_experts, ...]` tensors beside its frozen weights, one adapter per expert:
`lora_gate_up_A` (E, r, hidden) shared by the gate and up projections, `lora_gate_up_B`
(E, 2 x moe_intermediate, r) whose first half adapts gate and second half up, and
`lora_down_A` (E, r, moe_intermediate) / `lora_down_B` (E, hidden, r). Expert e computes
`gate = x W_g^T + s (x A^T) B_g^T` (likewise up and down), `s = alpha / r`: the product
peft's LoRA computes for a linear layer, without materialising `W + s B A`. A is drawn as
peft draws a linear adapter's (uniform within 1/sqrt(fan_in)), B starts at zero, so a fresh
adapter leaves the model unchanged. Being `[E, ...]` tensors in expert order, the adapters
are listed in the module's `expert_tensor_names` and expert parallelism slices them with
the experts (`expert_parallel.shard_experts`).

On disk (`lora_to_hf` / `lora_from_hf`) an expert adapter is what peft saves for a
Hugging Face model with one `nn.Linear` per expert: `...experts.{e}.{gate,up,down}_proj.
lora_{A,B}.weight`, the gate and up projections carrying the same A.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

LORA_TENSORS = ("lora_gate_up_A", "lora_gate_up_B", "lora_down_A", "lora_down_B")
_GROUPED_LORA_KEY = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<name>lora_(?:gate_up|down)_[AB])$")
_HF_LORA_KEY = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)"
    r"\.lora_(?P<part>[AB])\.weight$"
)


class ExpertLoraError(ValueError):
    """An expert adapter that does not fit the model (the message says which tensor)."""


def add_expert_lora(experts: nn.Module, rank: int, alpha: float) -> list[nn.Parameter]:
    """Attach a rank-`rank` adapter to every expert of `experts`; returns its tensors."""
    gate = experts.gate_proj
    count, inter, hidden = gate.shape
    shapes = {
        "lora_gate_up_A": (count, rank, hidden),
        "lora_gate_up_B": (count, 2 * inter, rank),
        "lora_down_A": (count, rank, inter),
        "lora_down_B": (count, hidden, rank),
    }
    params = []
    for name, shape in shapes.items():
        tensor = torch.zeros(shape, dtype=gate.dtype, device=gate.device)
        if name.endswith("_A"):
            bound = 1.0 / math.sqrt(shape[-1])  # peft's kaiming_uniform(a=sqrt(5)) on (r, in)
            tensor.uniform_(-bound, bound)
        param = nn.Parameter(tensor)
        experts.register_parameter(name, param)
        params.append(param)
    experts.lora_scale = alpha / rank
    return params


def is_expert_lora(name: str) -> bool:
    """Whether a state-dict name is a grouped expert adapter's tensor."""
    return _GROUPED_LORA_KEY.match(name) is not None


def has_expert_lora(experts: nn.Module) -> bool:
    return isinstance(getattr(experts, "lora_gate_up_A", None), torch.Tensor)


def swiglu_lora_expert(
    experts: nn.Module, chunk: torch.Tensor, *tensors: torch.Tensor
) -> torch.Tensor:
    """One expert's SwiGLU with its adapter: `tensors` are the expert's slices of
    gate, up, down and the four `LORA_TENSORS`."""
    gate, up, down, gate_up_a, gate_up_b, down_a, down_b = tensors
    scale = experts.lora_scale
    low = (chunk @ gate_up_a.T) * scale
    inter = gate.shape[0]
    gate_out = chunk @ gate.T + low @ gate_up_b[:inter].T
    up_out = chunk @ up.T + low @ gate_up_b[inter:].T
    hidden = experts.act_fn(gate_out) * up_out
    return hidden @ down.T + ((hidden @ down_a.T) * scale) @ down_b.T


def lora_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Grouped expert adapters -> one peft `lora_A`/`lora_B` pair per expert projection;
    other tensors pass through."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        match = _GROUPED_LORA_KEY.match(key)
        if match is None:
            out[key] = tensor
            continue
        prefix, name = match["prefix"], match["name"]
        for e in range(tensor.shape[0]):
            if name == "lora_gate_up_A":
                for proj in ("gate_proj", "up_proj"):
                    out[f"{prefix}.{e}.{proj}.lora_A.weight"] = tensor[e]
            elif name == "lora_gate_up_B":
                gate, up = tensor[e].chunk(2, dim=0)
                out[f"{prefix}.{e}.gate_proj.lora_B.weight"] = gate
                out[f"{prefix}.{e}.up_proj.lora_B.weight"] = up
            else:
                out[f"{prefix}.{e}.down_proj.lora_{name[-1]}.weight"] = tensor[e]
    return out


def lora_from_hf(state: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """The inverse of `lora_to_hf` for `count` experts per layer; refuses an adapter whose
    experts are missing or whose gate and up projections have different A factors."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[tuple[str, str], dict[int, torch.Tensor]]] = {}
    for key, tensor in state.items():
        match = _HF_LORA_KEY.match(key)
        if match is None:
            out[key] = tensor
            continue
        group = parts.setdefault(match["prefix"], {}).setdefault((match["proj"], match["part"]), {})
        group[int(match["expert"])] = tensor
    for prefix, groups in parts.items():
        stacked = {k: _stack(prefix, k, v, count) for k, v in groups.items()}
        out.update(_grouped(prefix, stacked))
    return out


def _stack(
    prefix: str, key: tuple[str, str], experts: dict[int, torch.Tensor], count: int
) -> torch.Tensor:
    if set(experts) != set(range(count)):
        missing = sorted(set(range(count)) - set(experts))
        raise ExpertLoraError(
            f"{prefix}.*.{key[0]}.lora_{key[1]}: experts {missing[:4]} are missing "
            f"(the model has {count})"
        )
    return torch.stack([experts[e] for e in range(count)])


def _grouped(prefix: str, stacked: dict[tuple[str, str], torch.Tensor]) -> dict[str, torch.Tensor]:
    wanted = [(p, x) for p in ("gate_proj", "up_proj", "down_proj") for x in "AB"]
    absent = [f"{p}.lora_{x}" for p, x in wanted if (p, x) not in stacked]
    if absent:
        raise ExpertLoraError(f"{prefix}: the expert adapter has no {absent[0]}")
    gate_a, up_a = stacked["gate_proj", "A"], stacked["up_proj", "A"]
    if not torch.equal(gate_a, up_a):
        raise ExpertLoraError(
            f"{prefix}: gate_proj and up_proj have different lora_A; tuneyard's expert "
            "adapters share one A between them (AutoModel's form)"
        )
    gate_up_b = torch.cat([stacked["gate_proj", "B"], stacked["up_proj", "B"]], dim=1)
    return {
        f"{prefix}.lora_gate_up_A": gate_a,
        f"{prefix}.lora_gate_up_B": gate_up_b,
        f"{prefix}.lora_down_A": stacked["down_proj", "A"],
        f"{prefix}.lora_down_B": stacked["down_proj", "B"],
    }


def expert_lora_targets(config_targets: Any) -> str:
    """peft's `target_modules` for the saved adapter config: what it targeted plus every
    expert projection (`...experts.{e}.{gate,up,down}_proj`), as one regex."""
    experts = r".*\.experts\.\d+\.(?:gate_proj|up_proj|down_proj)"
    if isinstance(config_targets, str):
        return f"(?:{config_targets})|(?:{experts})"
    names = "|".join(re.escape(str(t)) for t in sorted(config_targets or ()))
    return f"(?:(?:.*\\.)?(?:{names}))|(?:{experts})" if names else experts
