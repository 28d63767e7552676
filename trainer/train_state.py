"""RNG state capture and restore, and the hash that identifies a recipe.

A resumed run must draw the same random numbers as the uninterrupted one (dropout, any
sampling in the model), so every rank's Python and torch (CPU and CUDA) generator states go
into `trainer_state.json`, gathered to rank 0, base64-encoded, restored per rank.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from typing import Any

import torch
import torch.distributed as dist


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode()


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": _encode(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = _encode(torch.cuda.get_rng_state())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(_decode(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_decode(state["cuda"]))


def gather_rng() -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (on all ranks)."""
    local = capture_rng()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [local]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, local)
    return states


def recipe_hash(recipe: dict[str, Any]) -> str:
    """A stable hash of the normalized recipe, ignoring keys that change on resume."""
    stable = {k: v for k, v in recipe.items() if k not in ("restore_from",)}
    text = json.dumps(stable, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
