"""`python -m trainer.export` without a worker: a full fine-tune's checkpoint rewritten in
another dtype as shards with an index, config and tokenizer; and the exit codes of a
refusal and of an unreadable checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from models.common.safetensors_io import iter_safetensors
from trainer.export import MANIFEST, MAX_SHARD_ENV, main


@pytest.fixture
def step_dir(tiny_dir: Path, tmp_path: Path) -> Path:
    """A full fine-tune's checkpoint as the trainer publishes it: `step_<N>/model/`."""
    step = tmp_path / "checkpoints" / "step_3"
    shutil.copytree(tiny_dir, step / "model")
    return step


def test_a_full_export_is_sharded_in_its_dtype_with_config_and_tokenizer(
    step_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_SHARD_ENV, "50000")
    out = tmp_path / "out"
    argv = ["--checkpoint", str(step_dir), "--out", str(out), "--kind", "full"]
    assert main([*argv, "--dtype", "bfloat16"]) == ExitCode.OK
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    source = dict(iter_safetensors(step_dir / "model"))
    written = dict(iter_safetensors(out))
    assert set(written) == set(source)
    for name, tensor in source.items():
        assert torch.equal(written[name], tensor.to(torch.bfloat16)), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (out / "tokenizer.json").is_file()
    manifest = json.loads((out / MANIFEST).read_text())
    assert (manifest["kind"], manifest["dtype"]) == ("full", "bfloat16")


def test_a_refusal_and_an_unreadable_checkpoint_have_their_exit_codes(
    step_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--out", str(tmp_path / "out"), "--dtype", "float32"]
    adapter = main(["--checkpoint", str(step_dir), "--kind", "adapter", *argv])
    assert adapter == ExitCode.UNSUPPORTED
    assert "holds no LoRA adapter" in capsys.readouterr().err
    missing = main(["--checkpoint", str(tmp_path / "nowhere"), "--kind", "full", *argv])
    assert missing == ExitCode.CHECKPOINT_ERROR
    assert "unreadable checkpoint" in capsys.readouterr().err
