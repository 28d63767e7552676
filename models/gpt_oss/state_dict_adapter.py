"""gpt-oss state-dict adapter: Hugging Face's grouped (in, out) expert tensors <-> native (out, in).

Hugging Face checkpoints already group each layer's experts: `...mlp.experts.gate_up_proj`
is (num_experts, hidden, 2*intermediate) and `...mlp.experts.down_proj` is
(num_experts, intermediate, hidden), both applied as `x @ W`. Native keeps the grouped
layout of every MoE family here, (num_experts, out, in) applied as `x @ W[e].T`, so these
two tensors are the checkpoint's transposed on their last two dimensions; gate/up rows
stay interleaved as in the checkpoint. Biases (`gate_up_proj_bias`, `down_proj_bias`),
the router (`mlp.router.weight`, `mlp.router.bias`), attention (with `self_attn.sinks`)
and norms have the same names and layouts on both sides. Every mapping is a transpose
view: `to_hf` and the load targets copy nothing (the reader fills a non-contiguous target
through one tensor-sized buffer), and the round trip is exact. `from_hf` refuses a
grouped tensor whose expert count differs from `num_local_experts`.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_TRANSPOSED = re.compile(r"^.*\.mlp\.experts\.(gate_up_proj|down_proj)$")


class ExpertLayoutError(KeyError):
    """A grouped expert tensor whose shape does not fit the config."""


def _transposed(fqn: str) -> bool:
    return _TRANSPOSED.match(fqn) is not None


def _swap(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.transpose(1, 2)


def _check_experts(fqn: str, tensor: torch.Tensor, config: Any) -> None:
    if tensor.shape[0] != config.num_local_experts:
        raise ExpertLayoutError(
            f"{fqn} holds {tensor.shape[0]} experts, config says {config.num_local_experts}"
        )


class GptOssStateDictAdapter:
    """Stateless conversions; names are equal on both sides, two tensors are transposed."""

    # Every target, the transposed views included, writes through to FSDP2-sharded storage
    # (tests/unit/models/test_gpt_oss_shard_load.py). Declined all the same: gpt-oss trains
    # with expert parallelism, and the shard-only path's `to_empty` after the trainer's
    # parallelize swaps the expert DTensor parameters' contents, which drops the 1/ep_size
    # gradient hook `trainer.parallelize.apply_expert_parallel` registered on them (expert
    # gradients come out ep_size times too large), so such runs keep the full-model load.
    supports_low_memory_dcp_load = False

    @staticmethod
    def convert_single_tensor_to_hf(fqn: str, tensor: torch.Tensor) -> list[tuple[str, Any]]:
        """One native tensor -> its Hugging Face (key, tensor) pair (a view, never a copy)."""
        return [(fqn, _swap(tensor) if _transposed(fqn) else tensor)]

    @classmethod
    def to_hf(cls, state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for fqn, tensor in state.items():
            if _transposed(fqn):
                _check_experts(fqn, tensor, config)
            out.update(cls.convert_single_tensor_to_hf(fqn, tensor))
        return out

    @staticmethod
    def from_hf(hf_state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Transpose the grouped expert projections; pass every other key through."""
        native: dict[str, torch.Tensor] = {}
        for key, tensor in hf_state.items():
            if _transposed(key):
                _check_experts(key, tensor, config)
                tensor = _swap(tensor)
            native[key] = tensor
        return native

    @staticmethod
    def hf_targets(params: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
        """Checkpoint key -> the parameter, or its transposed view, the key is read into."""
        return {
            fqn: _swap(param.data) if _transposed(fqn) else param for fqn, param in params.items()
        }
