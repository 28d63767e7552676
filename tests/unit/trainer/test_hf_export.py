"""Checkpoint `model/` dirs load with the Hugging Face Auto classes offline, as is."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from jobs.recipe.typed import TargetCall
from trainer.checkpoint import hf_export
from trainer.checkpoint.manager import CheckpointManager

MESSAGES = [{"role": "user", "content": "Reverse 12:"}]


def _run(model, tokenizer, model_kwargs: dict, root: Path, is_peft: bool) -> SimpleNamespace:
    """The fields of a TrainingRun that a checkpoint save reads."""
    call = TargetCall("tuneyard.models.AutoModelForCausalLM.from_pretrained", model_kwargs)
    return SimpleNamespace(
        model=model,
        tokenizer=tokenizer,
        recipe=SimpleNamespace(model=call),
        env=SimpleNamespace(is_rank0=True),
        is_peft=is_peft,
        pipeline=None,  # not a pipeline-parallel run
        step=5,
        checkpoints=CheckpointManager(root, is_rank0=True),
    )


def _save(run: SimpleNamespace) -> Path:
    staging = run.checkpoints.begin(run.step)
    hf_export.save_model_dir(run, staging)
    return run.checkpoints.publish(run.step, {"step": run.step})


def _native(tiny_dir: Path):
    from models.auto import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype="float32")


def _with_lora(model):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # B starts at zero: make the adapter change the logits
    return peft_model


def test_full_checkpoint_loads_with_auto_classes(
    tiny_dir: Path, tokenizer, tmp_path: Path, offline_hub
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = _native(tiny_dir)
    kwargs = {"pretrained_model_name_or_path": str(tiny_dir)}
    model_dir = _save(_run(model, tokenizer, kwargs, tmp_path, is_peft=False)) / "model"
    loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(0, 512, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    generation = GenerationConfig.from_pretrained(model_dir)
    assert generation.to_dict() == GenerationConfig.from_pretrained(tiny_dir).to_dict()
    reloaded = AutoTokenizer.from_pretrained(model_dir)
    text = reloaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == "<|user|>Reverse 12:<|end|><|assistant|>"


def test_generation_config_is_derived_when_the_base_has_none(
    tiny_dir: Path, tmp_path: Path, offline_hub
) -> None:
    from transformers import GenerationConfig

    from cli.demo_assets import tiny_llama_config

    model = _native(tiny_dir)
    config = {"config": tiny_llama_config().to_dict()}
    model_dir = _save(_run(model, None, config, tmp_path, is_peft=False)) / "model"
    generation = GenerationConfig.from_pretrained(model_dir)
    assert (generation.bos_token_id, generation.eos_token_id) == (1, 2)


def _peft_logits(adapter_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from peft import AutoPeftModelForCausalLM

    loaded = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype=torch.float32)
    with torch.no_grad():
        return loaded.eval()(input_ids=ids).logits


def test_lora_adapter_names_its_base_and_loads_with_auto_peft(
    tiny_dir: Path, tokenizer, tmp_path: Path, offline_hub
) -> None:
    from transformers import AutoTokenizer

    peft_model = _with_lora(_native(tiny_dir)).eval()
    kwargs = {"pretrained_model_name_or_path": str(tiny_dir)}
    final = _save(_run(peft_model, tokenizer, kwargs, tmp_path, is_peft=True))
    adapter = final / "model"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_dir.resolve())
    assert peft_model.peft_config["default"].base_model_name_or_path is None  # live untouched
    assert not (final / hf_export.BASE_MODEL_DIR).exists()
    assert str(tiny_dir.resolve()) in (adapter / "README.md").read_text()
    ids = torch.randint(0, 512, (2, 7))
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
    torch.testing.assert_close(_peft_logits(adapter, ids), expected)
    assert AutoTokenizer.from_pretrained(adapter).apply_chat_template(MESSAGES, tokenize=False)


def test_lora_on_a_from_config_model_saves_its_base_beside_the_adapter(
    tiny_dir: Path, tokenizer, tmp_path: Path, single_rank_group, one_rank_layout, offline_hub
) -> None:
    from safetensors import safe_open

    from cli.demo_assets import tiny_llama_config
    from models.auto import AutoModelForCausalLM
    from trainer.distributed import build_mesh
    from trainer.parallelize import parallelize

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(), dtype="float32")
    peft_model = _with_lora(model).eval()
    layout = one_rank_layout()
    topology = build_mesh(single_rank_group, layout)
    parallelize(peft_model, topology, layout, torch.device("cpu"), None)
    ids = torch.randint(0, 512, (2, 7))
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
    kwargs = {"config": tiny_llama_config().to_dict()}
    final = _save(_run(peft_model, tokenizer, kwargs, tmp_path, is_peft=True))
    base_dir = final / hf_export.BASE_MODEL_DIR
    config = json.loads((final / "model" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_dir)
    with safe_open(base_dir / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("lora" in n or "base_layer" in n for n in names)
    assert "move the checkpoint" in (final / "model" / "README.md").read_text()
    torch.testing.assert_close(_peft_logits(final / "model", ids), expected)


@pytest.mark.parametrize("value", ["org/some-model", None])
def test_base_model_reference_keeps_hub_ids_and_knows_from_config(value) -> None:
    call = TargetCall("x", {"pretrained_model_name_or_path": value} if value else {})
    assert hf_export.base_model_reference(call) == value
