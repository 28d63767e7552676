"""Hub dataset names (trainer/data/hub.py): read from a hub-cache snapshot offline, as files are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import squad_hub_rows, write_hub_dataset

from cli.demo_assets import instruction_pairs, write_instruction_jsonl, write_squad_dir
from jobs.recipe.exit_codes import ExitCode
from trainer.data.datasets import JsonlInstructionDataset, SquadDataset, TextDataset
from trainer.errors import TrainerError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty, offline hub cache under a temporary HF_HOME."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return home / "hub"


@pytest.fixture
def squad(tmp_path: Path, hub_cache: Path) -> Path:
    """Local SQuAD JSON, and the same examples cached as hub dataset `org/squad`."""
    local = write_squad_dir(tmp_path / "squad", n=12)
    splits = {s: squad_hub_rows(local / f"{s}.json") for s in ("train", "validation")}
    write_hub_dataset(hub_cache, "org/squad", splits)
    return local


@pytest.mark.parametrize("split", ["train", "validation"])
def test_hub_squad_yields_the_samples_of_its_local_json(tokenizer, squad: Path, split) -> None:
    hub = SquadDataset(tokenizer, "org/squad", split=split, max_seq_length=24)
    local = SquadDataset(tokenizer, str(squad), split=split, max_seq_length=24)
    assert len(hub) == len(local) > 0
    assert hub.samples == local.samples


def test_split_slices_and_sample_limits(tokenizer, squad: Path) -> None:
    local = SquadDataset(tokenizer, str(squad), split="train").samples
    assert SquadDataset(tokenizer, "org/squad", split="train[:3]").samples == local[:3]
    assert SquadDataset(tokenizer, "org/squad", split="train[4:6]").samples == local[4:6]
    limited = SquadDataset(tokenizer, "org/squad", split="train", limit_dataset_samples=5)
    assert limited.samples == local[:5]


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_uncached_name_offline_is_a_data_error(
    tokenizer, hub_cache: Path, monkeypatch: pytest.MonkeyPatch, offline: str
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(offline, "1")
    with pytest.raises(TrainerError) as info:
        SquadDataset(tokenizer, "org/not-cached", split="train")
    assert info.value.exit_code == ExitCode.DATA_ERROR
    message = info.value.message
    assert "org/not-cached" in message and "not in the local Hugging Face cache" in message
    assert f"{offline}=1" in message and str(hub_cache) in message


def test_unknown_split_is_a_data_error(tokenizer, squad: Path) -> None:
    with pytest.raises(TrainerError) as info:
        SquadDataset(tokenizer, "org/squad", split="test")
    assert info.value.exit_code == ExitCode.DATA_ERROR
    assert "'test'" in info.value.message and "org/squad" in info.value.message


def test_hub_rows_without_answers_name_the_dataset(tokenizer, hub_cache: Path) -> None:
    row = {"id": "1", "title": "t", "context": "c", "question": "q?"}
    write_hub_dataset(hub_cache, "org/broken", {"train": [{**row, "answers": {"text": []}}]})
    with pytest.raises(TrainerError, match=r"org/broken\[train\]: example 1 has no"):
        SquadDataset(tokenizer, "org/broken")


def test_instruction_and_text_datasets_read_the_train_split(
    tokenizer, tmp_path: Path, hub_cache: Path
) -> None:
    local = write_instruction_jsonl(tmp_path / "d.jsonl", 6)
    rows = [json.loads(line) for line in local.read_text().splitlines()]
    texts = [{"text": p["prompt"] + p["completion"]} for p in instruction_pairs(6)]
    write_hub_dataset(hub_cache, "org/pairs", {"train": rows, "test": rows[:1]}, config="default")
    write_hub_dataset(hub_cache, "org/text", {"train": texts}, config="default")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts))

    hub = JsonlInstructionDataset(tokenizer, "org/pairs", limit_dataset_samples=4)
    assert hub.samples == JsonlInstructionDataset(tokenizer, str(local)).samples[:4]
    hub_text = TextDataset(tokenizer, "org/text", seq_length=8)
    assert (
        hub_text.samples == TextDataset(tokenizer, str(tmp_path / "t.jsonl"), seq_length=8).samples
    )


def test_a_local_directory_shaped_like_a_hub_name_stays_local(
    tokenizer, tmp_path: Path, squad: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_squad_dir(tmp_path / "org" / "squad", n=3)
    monkeypatch.chdir(tmp_path)
    assert len(SquadDataset(tokenizer, "org/squad", split="train")) == 3  # not the 12 cached


def test_importing_the_datasets_module_does_not_import_hf_datasets() -> None:
    code = "import sys, trainer.data.datasets; sys.exit('datasets' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
