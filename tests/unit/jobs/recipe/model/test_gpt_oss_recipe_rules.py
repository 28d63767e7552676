"""Submit-time rules for gpt-oss (`GptOssForCausalLM`): what its registry row and config allow.

Expert parallelism over both data-parallel ranks and LoRA are accepted; tensor
parallelism is refused at `distributed.tp_size` (no tensor-parallel plan). With ep_size 2,
a quantized (MXFP4) checkpoint, `force_hf` and another `attn_implementation` are refused
at their field: each leaves no native grouped experts to spread, as the trainer would
find. Without expert parallelism the quantized checkpoint is accepted (it loads the
Hugging Face class, data parallel). The shipped tiny example
(examples/llm_finetune/tiny_gpt_oss_ep.yaml) validates with its assets built.
"""

from __future__ import annotations

from pathlib import Path

from family_recipe_checks import assert_hf_class_refused
from recipe_asserts import error_at, write_model_dir

EXAMPLES = Path(__file__).resolve().parents[5] / "examples" / "llm_finetune"

GPT_OSS_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 256,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}  # fmt: skip
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}


def _gpt_oss(recipe: dict, data_root, ep_size: int = 2, **config) -> dict:
    model_dir = write_model_dir(data_root / "gpt_oss", {**GPT_OSS_CONFIG, **config})
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    recipe["distributed"]["ep_size"] = ep_size
    return recipe


def test_expert_parallelism_and_lora_are_accepted(validate, recipe, data_root):
    result = validate(_gpt_oss(recipe, data_root), nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "GptOssForCausalLM" and result.plan["ep_size"] == 2
    lora = _gpt_oss(recipe, data_root, ep_size=1)
    lora["peft"] = {"dim": 8, "alpha": 16}
    result = validate(lora, nproc_per_node=1)
    assert result.valid, [str(e) for e in result.errors]


def test_tensor_parallelism_is_refused(validate, recipe, data_root):
    recipe = _gpt_oss(recipe, data_root, ep_size=1)
    recipe["distributed"]["tp_size"] = 2
    error = error_at(validate(recipe, nproc_per_node=2), "distributed.tp_size")
    assert "GptOssForCausalLM does not support tensor parallelism" in error.msg


def test_a_quantized_checkpoint_refuses_expert_parallelism(validate, recipe, data_root):
    quantized = _gpt_oss(recipe, data_root, quantization_config=MXFP4)
    error = error_at(validate(quantized, nproc_per_node=2), "distributed.ep_size")
    assert "quantized" in error.msg and "dequantized" in error.fix
    plain = _gpt_oss(recipe, data_root, ep_size=1, quantization_config=MXFP4)
    result = validate(plain, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]


def test_the_hugging_face_class_refuses_expert_parallelism(validate, recipe, data_root):
    forced = _gpt_oss(recipe, data_root)
    assert_hf_class_refused(validate, forced, "Hugging Face class", "ep_size: 1", "experts")


def test_the_tiny_example_validates_with_its_assets(validate, data_root, squad_dir):
    from examples.llm_finetune.build_tiny_gpt_oss import build_tiny_gpt_oss

    model_dir = build_tiny_gpt_oss(data_root / "tiny_gpt_oss")
    overrides = [
        f"--model.pretrained_model_name_or_path={model_dir}",
        f"--dataset.path_or_dataset={squad_dir}",
        f"validation_dataset.path_or_dataset={squad_dir}",
    ]
    result = validate(EXAMPLES / "tiny_gpt_oss_ep.yaml", overrides, nproc_per_node=2)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "GptOssForCausalLM" and result.plan["ep_size"] == 2
