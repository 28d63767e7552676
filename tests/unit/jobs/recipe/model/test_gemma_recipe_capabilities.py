"""Submit-time checks for Gemma 2 / Gemma 3 text checkpoints, from the torch-free registry rows.

TP (with sequence parallelism) validates for both families; pipeline, context and expert
parallelism are refused with their field; LoRA validates; the multimodal
`Gemma3ForConditionalGeneration` has no row, so model-parallel sizes are refused for it.
"""

from __future__ import annotations

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at, write_model_dir

GEMMA = {
    **{k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "tie_word_embeddings"},
    "head_dim": 16,
    "sliding_window": 8,
    "query_pre_attn_scalar": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "tie_word_embeddings": True,
}
CONFIGS = {
    "Gemma2ForCausalLM": {**GEMMA, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"},
    "Gemma3ForCausalLM": {
        **GEMMA,
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
    },
}


@pytest.fixture(params=sorted(CONFIGS))
def gemma_recipe(request, recipe, data_root):
    directory = write_model_dir(data_root / request.param, CONFIGS[request.param])
    recipe["model"]["pretrained_model_name_or_path"] = str(directory)
    return request.param, recipe


def test_gemma_tensor_parallel_and_lora_validate(validate, gemma_recipe):
    architecture, recipe = gemma_recipe
    recipe["distributed"].update(tp_size=2, sequence_parallel=True)
    result = validate(recipe, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == architecture
    recipe["distributed"] = {"strategy": "fsdp2"}
    recipe["peft"] = {"match_all_linear": True, "dim": 8, "alpha": 16}
    assert validate(recipe, nproc_per_node=2).valid


@pytest.mark.parametrize("field", ["pp_size", "cp_size", "ep_size"])
def test_gemma_refuses_what_it_does_not_prove(validate, gemma_recipe, field):
    architecture, recipe = gemma_recipe
    recipe["distributed"][field] = 2
    error = error_at(validate(recipe, nproc_per_node=2), f"distributed.{field}")
    assert architecture in error.msg and "does not support" in error.msg


def test_multimodal_gemma3_gets_data_parallel_only(validate, recipe, data_root):
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {**GEMMA, "model_type": "gemma3_text"},
    }
    recipe["model"]["pretrained_model_name_or_path"] = str(
        write_model_dir(data_root / "gemma3-mm", config)
    )
    recipe["distributed"]["tp_size"] = 2
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size")
    assert "Gemma3ForConditionalGeneration" in error.msg
