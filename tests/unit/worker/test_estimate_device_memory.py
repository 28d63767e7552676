"""A worker's device memory for the queue's fit check: declared, read from nvidia-smi, or
unknown; and it is in the heartbeat's resources."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from worker import state


def _fake_nvidia_smi(directory: Path, output: str) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_a_declared_size_wins(monkeypatch):
    monkeypatch.setenv(state.DEVICE_MEMORY_ENV, "80GiB")
    assert state.probe_device_memory() == 80 << 30


def test_an_unreadable_declared_size_is_ignored(monkeypatch):
    monkeypatch.setenv(state.DEVICE_MEMORY_ENV, "lots")
    assert state.probe_device_memory() is None


def test_nvidia_smi_gives_the_smallest_gpu(monkeypatch, tmp_path):
    monkeypatch.delenv(state.DEVICE_MEMORY_ENV, raising=False)
    _fake_nvidia_smi(tmp_path, "81559\\n40960\\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert state.probe_device_memory() == 40960 << 20


def test_no_gpu_and_nothing_declared_is_unknown(monkeypatch, tmp_path):
    monkeypatch.delenv(state.DEVICE_MEMORY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    assert state.probe_device_memory() is None


@pytest.mark.parametrize("declared", ["24GB", None])
def test_the_heartbeat_carries_it(monkeypatch, tmp_path, declared):
    monkeypatch.setenv("PATH", str(tmp_path))
    if declared:
        monkeypatch.setenv(state.DEVICE_MEMORY_ENV, declared)
    else:
        monkeypatch.delenv(state.DEVICE_MEMORY_ENV, raising=False)
    from worker.config import get_worker_config

    resources = state.WorkerState(get_worker_config()).resources()
    assert resources["device_memory_bytes"] == (24 << 30 if declared else None)
