"""The merge math of `trainer.checkpoint.merge_lora` against peft's own `merge_and_unload`:
plain LoRA on linear layers and an embedding, rsLoRA with rank and alpha patterns, DoRA, and
tensors saved whole (`modules_to_save`); and the refusals (DoRA on an embedding, a rank the
config does not state, a tensor that is no LoRA part)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from models.common.safetensors_io import read_tensors
from trainer.checkpoint.merge_lora import AdapterWeights, MergeRefused, merged_weight


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.q_proj = nn.Linear(8, 8, bias=False)
        self.up_proj = nn.Linear(8, 12, bias=False)
        self.head = nn.Linear(12, 5)


def _adapter_dir(tmp_path: Path, **lora: object) -> tuple[Path, dict, dict]:
    """A saved peft adapter on `Tiny` with random B (and magnitude) and peft's merged state."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = Tiny()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, LoraConfig(**lora))  # type: ignore[arg-type]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.add_(torch.randn_like(param) * 0.3)
    model.save_pretrained(tmp_path)
    merged = model.merge_and_unload().state_dict()
    return tmp_path, before, merged


def _our_merge(directory: Path, base: dict) -> dict:
    adapter = AdapterWeights.read(directory)
    out = {}
    for name, weight in base.items():
        if name in adapter.replacements:
            out[name] = adapter.replacements[name]
        elif name in adapter.deltas:
            out[name] = merged_weight(weight, adapter.deltas[name])
        else:
            out[name] = weight
    return out


CASES = {
    "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "up_proj", "embed"]},
    "rslora_patterns": {
        "r": 4,
        "lora_alpha": 16,
        "use_rslora": True,
        "target_modules": ["q_proj", "up_proj"],
        "rank_pattern": {"up_proj": 2},
        "alpha_pattern": {"q_proj": 3},
    },
    "dora_and_saved_head": {
        "r": 2,
        "lora_alpha": 4,
        "use_dora": True,
        "target_modules": ["q_proj", "up_proj"],
        "modules_to_save": ["head"],
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_merge_equals_peft_merge_and_unload(tmp_path: Path, case: str) -> None:
    directory, base, expected = _adapter_dir(tmp_path, **CASES[case])
    ours = _our_merge(directory, base)
    assert set(ours) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-6, rtol=1e-6, msg=name)
    changed = [n for n in expected if not torch.equal(expected[n], base[n])]
    assert changed  # the case merges something


def _rewrite(directory: Path, config_edit: dict | None = None, extra: dict | None = None) -> None:
    config_path = directory / "adapter_config.json"
    config = json.loads(config_path.read_text()) | (config_edit or {})
    config_path.write_text(json.dumps(config))
    path = directory / "adapter_model.safetensors"
    save_file(dict(read_tensors(path)) | (extra or {}), str(path), metadata={"format": "pt"})


def test_dora_on_an_embedding_is_refused(tmp_path: Path) -> None:
    directory, _, _ = _adapter_dir(tmp_path, r=2, lora_alpha=4, target_modules=["q_proj"])
    magnitude = {"base_model.model.embed.lora_magnitude_vector": torch.ones(8)}
    extra = {
        "base_model.model.embed.lora_embedding_A": torch.zeros(2, 11),
        "base_model.model.embed.lora_embedding_B": torch.zeros(8, 2),
        **magnitude,
    }
    _rewrite(directory, extra=extra)
    with pytest.raises(MergeRefused, match="DoRA on an embedding"):
        AdapterWeights.read(directory)


def test_a_rank_the_config_does_not_state_is_refused(tmp_path: Path) -> None:
    directory, _, _ = _adapter_dir(tmp_path, r=2, lora_alpha=4, target_modules=["q_proj"])
    _rewrite(directory, config_edit={"r": 3})
    with pytest.raises(MergeRefused, match="rank 2 but adapter_config.json says 3"):
        AdapterWeights.read(directory)


def test_an_unknown_lora_tensor_and_conv1d_layers_are_refused(tmp_path: Path) -> None:
    directory, _, _ = _adapter_dir(tmp_path, r=2, lora_alpha=4, target_modules=["q_proj"])
    _rewrite(directory, extra={"base_model.model.q_proj.lora_C.weight": torch.zeros(2)})
    with pytest.raises(MergeRefused, match="no LoRA part"):
        AdapterWeights.read(directory)
    _rewrite(directory, config_edit={"fan_in_fan_out": True})
    with pytest.raises(MergeRefused, match="fan_in_fan_out"):
        AdapterWeights.read(directory)
