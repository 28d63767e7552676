"""`model_weights` keeps a plain-dict config's list by its content (torch-free)."""

from __future__ import annotations

from jobs.recipe.plan.flops import model_weights, param_count

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
         "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip


def test_same_content_same_weights_and_a_changed_config_is_counted_again():
    first = param_count(dict(LLAMA))
    assert param_count(dict(LLAMA)) == first
    deeper = {**LLAMA, "num_hidden_layers": 4}
    assert param_count(deeper) > first
    deeper["num_hidden_layers"] = 2  # the same dict, changed back: counted from its content
    assert param_count(deeper) == first


def test_a_callers_change_to_the_list_does_not_reach_the_next_caller():
    weights = model_weights(dict(LLAMA))
    count = len(weights)
    weights.clear()
    assert len(model_weights(dict(LLAMA))) == count


def test_configs_that_are_not_json_like_are_counted_without_keeping():
    odd = {**LLAMA, 7: "an int key", "rope_scaling": {"factor": float("nan")}}
    mixed = {**LLAMA, 1: "a", "b": object()}
    assert param_count(odd) == param_count(dict(LLAMA))
    assert param_count(mixed) == param_count(dict(LLAMA))
