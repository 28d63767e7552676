"""Shared fixtures for the model tests: the family parameter and a tiny Llama directory."""

from __future__ import annotations

import pytest
import torch
from tiny_model_configs import FAMILIES

torch.set_num_threads(1)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from cli.demo_assets import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
