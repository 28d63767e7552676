"""Unit fixtures for the trainer: one tiny tokenizer and model dir per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.assets import build_tiny_llama

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
