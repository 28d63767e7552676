"""Unit fixtures for the trainer: one tiny tokenizer and model dir per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cli.demo_assets import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("unit-tiny-llama"))


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def single_rank_group():
    """A one-process gloo group, as `python -m trainer` forms it."""
    import torch.distributed as dist

    from trainer.distributed import init_distributed, shutdown

    env = init_distributed()
    yield env
    if dist.is_initialized():
        shutdown()


@pytest.fixture
def one_rank_layout():
    """The validated layout of a one-process job (`jobs.recipe.typed.Topology`), with overrides."""
    from jobs.recipe.typed import Topology

    def make(**overrides):
        fields = dict(
            world_size=1, nnodes=1, nproc_per_node=1, accelerator="cpu", strategy="fsdp2",
            dp_size=1, dp_replicate_size=1, dp_shard_size=1, tp_size=1, pp_size=1, cp_size=1,
            ep_size=1, mesh_shape={"dp_shard": 1, "tp": 1}, sequence_parallel=False,
            activation_checkpointing=False, options={},
        )  # fmt: skip
        return Topology(**{**fields, **overrides})

    return make


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1 for code that already imported huggingface_hub: no download possible."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
