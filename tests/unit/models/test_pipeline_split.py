"""The stage split of native decoder stacks: layer ranges, Hugging Face names kept, and
stages that, run one after another, compute exactly the unsplit model's logits."""

from __future__ import annotations

import pytest
import torch
from _deepseek_v3_worker import tiny_config
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from models.common.pipeline_split import (
    StageLayers,
    split_model,
    split_unsupported_reason,
    stage_layer_ranges,
)
from models.deepseek_v3.model import DeepseekV3ForCausalLM
from models.llama.model import LlamaForCausalLM
from models.qwen2.model import Qwen2ForCausalLM
from models.qwen3.model import Qwen3ForCausalLM

TINY = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=False, pad_token_id=0,
)  # fmt: skip


def tiny_llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM.from_config(LlamaConfig(**{**TINY, **overrides}))


def test_even_split_gives_earlier_stages_the_remainder():
    assert stage_layer_ranges(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layer_ranges(6, 4, layers_per_stage=None)[-1] == range(5, 6)


def test_layers_per_stage_must_cover_the_model_exactly():
    assert stage_layer_ranges(4, 4, layers_per_stage=1) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ValueError, match="does not cover"):
        stage_layer_ranges(4, 2, layers_per_stage=1)
    with pytest.raises(ValueError, match="fewer than"):
        stage_layer_ranges(2, 4)


def test_stage_layers_keep_model_indices_as_names_but_index_by_position():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    layers = StageLayers([(2, a), (3, b)])
    assert [n for n, _ in layers.named_children()] == ["2", "3"]
    assert layers[0] is a and layers[-1] is b and list(layers) == [a, b] and len(layers) == 2
    assert layers.indices() == [2, 3]
    replacement = torch.nn.Linear(2, 2)
    layers[1] = replacement
    assert dict(layers.named_children())["3"] is replacement
    with pytest.raises(IndexError):
        layers[2]


def test_each_rank_keeps_exactly_its_stages_parameters_under_full_names():
    full_names = {n for n, _ in tiny_llama().named_parameters()}
    ranges = stage_layer_ranges(4, 4)  # looped: rank 0 holds stages 0 and 2 of 4
    model, stages = split_model(tiny_llama(), [0, 2], ranges)
    names = {n for n, _ in model.named_parameters()}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert {n.split(".")[2] for n in names if n.startswith("model.layers.")} == {"0", "2"}
    other, _ = split_model(tiny_llama(), [1, 3], ranges)
    other_names = {n for n, _ in other.named_parameters()}
    assert names.isdisjoint(other_names) and names | other_names == full_names
    assert [s.layers.indices() for s in stages] == [[0], [2]]
    assert stages[0].embed_tokens is model.model.embed_tokens and stages[1].lm_head is None


FAMILIES = {
    "llama": tiny_llama,
    "qwen2": lambda: _seeded(Qwen2ForCausalLM, Qwen2Config(**TINY)),  # q/k/v bias
    "qwen3": lambda: _seeded(Qwen3ForCausalLM, Qwen3Config(**TINY, head_dim=8)),  # q/k norms
    # latent attention, layer 0 dense then MoE layers
    "deepseek_v3": lambda: _seeded(DeepseekV3ForCausalLM, tiny_config(num_hidden_layers=4)),
}


def _seeded(cls, config):
    torch.manual_seed(0)
    return cls.from_config(config)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_stages_chained_compute_the_unsplit_logits(family):
    build = FAMILIES[family]

    ids = torch.randint(1, 128, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding: every stage must build the same attention mask
    want = build()(input_ids=ids, attention_mask=mask).logits
    _, stages = split_model(build(), [0, 1, 2], stage_layer_ranges(4, 3))
    hidden = ids
    for stage in stages:
        hidden = stage(hidden, attention_mask=mask)
    torch.testing.assert_close(hidden, want, rtol=0, atol=0)


def test_position_ids_reach_every_stage():
    ids = torch.randint(1, 128, (1, 8))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])  # two packed documents
    want = tiny_llama()(input_ids=ids, position_ids=positions).logits
    _, stages = split_model(tiny_llama(), [0, 1], stage_layer_ranges(4, 2))
    got = stages[1](stages[0](ids, position_ids=positions), position_ids=positions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_tied_embeddings_and_foreign_classes_are_refused():
    assert "ties lm_head" in split_unsupported_reason(tiny_llama(tie_word_embeddings=True))
    assert "not a native decoder stack" in split_unsupported_reason(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="ties lm_head"):
        split_model(tiny_llama(tie_word_embeddings=True), [0], stage_layer_ranges(4, 2))


def test_a_lora_wrapped_head_splits_and_computes_the_unsplit_logits():
    """LoRA on lm_head (AutoModel's `target_modules: ['*']`): the last stage runs the
    wrapped head."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    base = model.get_base_model()
    torch.nn.init.normal_(base.lm_head.lora_B["default"].weight)
    assert split_unsupported_reason(base) is None
    ids = torch.randint(1, 128, (2, 8))
    with torch.no_grad():
        want = base(input_ids=ids).logits
        _, stages = split_model(base, [0, 1], stage_layer_ranges(4, 2))
        hidden = ids
        for stage in stages:
            hidden = stage(hidden)
    torch.testing.assert_close(hidden, want)
