"""Checkpoint files: consolidation into Hugging Face directories, atomic publishing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from trainer.checkpoint import consolidate
from trainer.checkpoint.manager import STATE_FILE, CheckpointManager, is_complete
from trainer.errors import TrainerError


def _tiny_model(tiny_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp2_consolidated_checkpoint_gives_the_same_logits(
    tiny_dir: Path, tmp_path: Path, single_rank_group, tied: bool, one_rank_layout
) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    from cli.demo_assets import tiny_llama_config
    from trainer.distributed import build_mesh
    from trainer.parallelize import parallelize

    torch.manual_seed(0)
    tied_model = LlamaForCausalLM(tiny_llama_config(tie_word_embeddings=True))
    model = tied_model if tied else _tiny_model(tiny_dir)
    layout = one_rank_layout()
    parallelize(model, build_mesh(single_rank_group, layout), layout, torch.device("cpu"), None)
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    consolidate.save_consolidated_model(
        model, tmp_path / "out", is_rank0=True, max_shard_bytes=100_000
    )
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert ("lm_head.weight" in index["weight_map"]) is not tied  # a tied tensor is saved once
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected)


def test_load_model_weights_refuses_a_mismatched_checkpoint(tiny_dir: Path, tmp_path: Path):
    from transformers import LlamaForCausalLM

    from cli.demo_assets import tiny_llama_config

    LlamaForCausalLM(tiny_llama_config(hidden_size=32, intermediate_size=64)).save_pretrained(
        tmp_path / "other"
    )
    with pytest.raises(TrainerError) as info:
        consolidate.load_model_weights(_tiny_model(tiny_dir), tmp_path / "other")
    assert info.value.exit_code == ExitCode.CHECKPOINT_ERROR and "shape" in info.value.message


def test_a_malformed_weights_file_is_a_checkpoint_error(tiny_dir: Path, tmp_path: Path):
    model = _tiny_model(tiny_dir)
    model.save_pretrained(tmp_path / "cut")
    path = tmp_path / "cut" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(TrainerError) as info:
        consolidate.load_model_weights(model, tmp_path / "cut")
    assert info.value.exit_code == ExitCode.CHECKPOINT_ERROR and "outside" in info.value.message


def test_lora_adapter_round_trips_and_peft_loads_it(tiny_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model

    def with_lora(seed: int):
        torch.manual_seed(seed)
        return get_peft_model(_tiny_model(tiny_dir), LoraConfig(r=4, target_modules=["q_proj"]))

    trained = with_lora(0)
    with torch.no_grad():
        for name, param in trained.named_parameters():
            if "lora_" in name:
                param.normal_()
    consolidate.save_lora_adapter(trained, tmp_path / "adapter", is_rank0=True)
    ids = torch.randint(0, 512, (1, 7))
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        fresh = with_lora(1)
        consolidate.load_lora_adapter(fresh, tmp_path / "adapter")
        torch.testing.assert_close(fresh(input_ids=ids).logits, expected)
        by_peft = PeftModel.from_pretrained(_tiny_model(tiny_dir), tmp_path / "adapter")
        torch.testing.assert_close(by_peft(input_ids=ids).logits, expected)


def _publish(manager: CheckpointManager, step: int) -> Path:
    staging = manager.begin(step)
    (staging / "model").mkdir()
    return manager.publish(step, {"step": step})


def test_publish_moves_latest_and_prunes_but_never_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, is_rank0=True, keep_last=2)
    for step in (1, 2, 3):
        final = _publish(manager, step)
        assert (tmp_path / "checkpoints" / "LATEST").read_text().strip() == final.name
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "LATEST",
        "step_2",
        "step_3",
    ]
    assert manager.latest() == tmp_path / "checkpoints" / "step_3"
    assert not list((tmp_path / "checkpoints").glob(".staging_*"))


def test_incomplete_and_staging_dirs_are_never_resumed(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, is_rank0=True)
    _publish(manager, 1)
    half = manager.begin(2)  # killed mid-save: staging dir left behind
    (half / STATE_FILE).write_text("{}")
    assert not is_complete(half)
    assert manager.resolve(None) == tmp_path / "checkpoints" / "step_1"
    manager.remove_stale_staging()
    assert not half.exists()
    (tmp_path / "checkpoints" / "step_9").mkdir()
    with pytest.raises(TrainerError, match="not a complete checkpoint"):
        manager.resolve(str(tmp_path / "checkpoints" / "step_9"))
    assert manager.resolve(str(tmp_path / "checkpoints")) == tmp_path / "checkpoints" / "step_1"


def test_fresh_run_dir_has_nothing_to_resume(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path, is_rank0=True).resolve("LATEST") is None


@pytest.mark.parametrize("planted", ["../../other/checkpoints/step_5", "/elsewhere/step_5", "link"])
def test_a_latest_pointer_naming_anything_but_its_own_step_is_not_followed(
    tmp_path: Path, planted: str
) -> None:
    """A LATEST rewritten to lead out of its folder (a path, `..`, or a symlinked step) is
    never resumed from, whether the run resumes itself or restores from that folder."""
    elsewhere = tmp_path / "other" / "checkpoints" / "step_5"
    elsewhere.mkdir(parents=True)
    (elsewhere / STATE_FILE).write_text("{}")
    manager = CheckpointManager(tmp_path / "run", is_rank0=True)
    _publish(manager, 1)
    root = tmp_path / "run" / "checkpoints"
    if planted == "link":
        (root / "step_7").symlink_to(elsewhere, target_is_directory=True)
        planted = "step_7"
    (root / "LATEST").write_text(planted.replace("/elsewhere", str(tmp_path / "other/checkpoints")))
    assert manager.latest() is None
    with pytest.raises(TrainerError, match="incomplete checkpoint"):
        manager.resolve("LATEST")
    with pytest.raises(TrainerError, match="does not name a step_<N> directory"):
        manager.resolve(str(root))
