"""Submit-time rules for the DeepSeek-V3 row: what validates is what was proven.

Tensor parallelism with sequence parallelism validates, expert parallelism over the
data-parallel ranks validates, LoRA alone validates; LoRA together with tensor or expert
parallelism, and pipeline or context parallelism, are refused at their fields.
"""

from __future__ import annotations

from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

DEEPSEEK_V3 = {**TINY_LLAMA_CONFIG, "architectures": ["DeepseekV3ForCausalLM"],
               "model_type": "deepseek_v3", "num_key_value_heads": 4, "q_lora_rank": 48,
               "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
               "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "n_group": 4,
               "topk_group": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "first_k_dense_replace": 1}  # fmt: skip
LORA = {"match_all_linear": True, "dim": 8, "alpha": 16}


def _use(recipe, data_root):
    directory = write_model_dir(data_root / "deepseek_v3", DEEPSEEK_V3)
    recipe["model"]["pretrained_model_name_or_path"] = str(directory)


def _valid(validate, recipe):
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "DeepseekV3ForCausalLM"


def test_tensor_expert_and_lora_runs_validate(validate, recipe, data_root):
    _use(recipe, data_root)
    recipe["distributed"].update(tp_size=2, sequence_parallel=True)
    _valid(validate, recipe)
    recipe["distributed"].update(tp_size=1, sequence_parallel=False, ep_size=2)
    _valid(validate, recipe)
    recipe["distributed"]["ep_size"] = 1
    recipe["peft"] = dict(LORA)
    _valid(validate, recipe)


def test_lora_with_tp_and_cp_are_refused_lora_with_ep_runs(validate, recipe, data_root):
    _use(recipe, data_root)
    recipe["peft"] = dict(LORA)
    recipe["distributed"]["ep_size"] = 2
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]  # expert adapters spread with EP
    recipe["distributed"].update(ep_size=1, tp_size=2)
    error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size")
    del recipe["peft"]
    recipe["distributed"].update(tp_size=1, cp_size=2)  # (pp: test_pipeline_rules.py)
    error_at(validate(recipe, nproc_per_node=2), "distributed.cp_size")
