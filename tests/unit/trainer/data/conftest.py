"""Fixtures for the `datasets`-backed datasets: a private datasets cache per test and a
tokenizer of its own (a dataset's `chat_template` sets the template on the tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-datasets"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    return cache


@pytest.fixture
def tok(tiny_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)
