"""Submit-time rules for Phi-3 (`Phi3ForCausalLM`): what its registry row and config allow.

Tensor parallelism (with sequence parallelism) is accepted; with residual dropout on
(`resid_pdrop` > 0 in config.json or as a model override) it is refused at
`distributed.tp_size`, as the family's plan refuses it in the trainer; an override back to
0.0 is accepted; force_hf or another attn_implementation (the fused Hugging Face class) is
refused with tp. LoRA is accepted (its export is fused for transformers' Phi-3); DoRA only
when it adapts every linear layer (its magnitudes are fused too).
"""

from __future__ import annotations

from family_recipe_checks import assert_hf_class_refused
from recipe_asserts import error_at, write_model_dir

PHI3_CONFIG = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}  # fmt: skip
TP = {"tp_size": 2, "sequence_parallel": True}


def _phi3(recipe: dict, data_root, **config) -> dict:
    model_dir = write_model_dir(data_root / "phi3", {**PHI3_CONFIG, **config})
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    recipe["distributed"].update(TP)
    return recipe


def test_phi3_tensor_parallel_is_accepted(validate, recipe, data_root):
    result = validate(_phi3(recipe, data_root, resid_pdrop=0.0), nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "Phi3ForCausalLM" and result.plan["tp_size"] == 2


def test_residual_dropout_refuses_tensor_parallelism(validate, recipe, data_root):
    result = validate(_phi3(recipe, data_root, resid_pdrop=0.1), nproc_per_node=2)
    error = error_at(result, "distributed.tp_size")
    assert "resid_pdrop 0.1" in error.msg and "tp_size: 1" in error.fix


def test_a_dropout_override_is_checked_too(validate, recipe, data_root):
    on = _phi3(recipe, data_root)
    on["model"]["resid_pdrop"] = 0.1
    assert "resid_pdrop" in error_at(validate(on, nproc_per_node=2), "distributed.tp_size").msg
    off = _phi3(recipe, data_root, resid_pdrop=0.1)
    off["model"]["resid_pdrop"] = 0.0
    result = validate(off, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]


def _lora(recipe: dict, data_root, **peft) -> dict:
    recipe = _phi3(recipe, data_root)
    recipe["distributed"].update(tp_size=1, sequence_parallel=False)
    recipe["peft"] = {"dim": 8, "alpha": 16, **peft}
    return recipe


def test_lora_and_all_linear_dora_are_accepted(validate, recipe, data_root):
    for peft in ({"target_modules": ["q_proj", "v_proj"]}, {"use_dora": True}):
        result = validate(_lora(recipe, data_root, **peft), nproc_per_node=1)
        assert result.valid, [str(e) for e in result.errors]


def test_dora_on_some_projections_is_refused(validate, recipe, data_root):
    for peft in (
        {"use_dora": True, "target_modules": ["q_proj", "v_proj"]},
        {"use_dora": True, "match_all_linear": True, "exclude_modules": ["k_proj"]},
    ):
        error = error_at(
            validate(_lora(recipe, data_root, **peft), nproc_per_node=1), "peft.use_dora"
        )
        assert "must adapt every linear layer" in error.msg and "match_all_linear" in error.fix


def test_the_fused_hugging_face_class_refuses_tensor_parallelism(validate, recipe, data_root):
    forced = _phi3(recipe, data_root)
    assert_hf_class_refused(validate, forced, "fused qkv_proj/gate_up_proj", "tp_size: 1", "fused")
