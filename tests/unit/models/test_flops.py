"""Parameter counts and training FLOPs from a config, against the built models and by hand.

Every registered family's count equals `sum(p.numel())` of the native class built from the
same tiny config (from the config object and from its plain dict, as validation reads a
config.json). FLOPs per token are checked against hand-written arithmetic for a dense
(multi-head), a GQA, a MoE and a LoRA config.
"""

from __future__ import annotations

import subprocess
import sys

import gemma_tiny_configs
import gpt_oss_tiny
import mistral_family_configs
import phi3_tiny
import pytest
import tiny_model_configs
from _deepseek_v3_worker import tiny_config as deepseek_config

from jobs.recipe.plan.flops import (
    FAMILY_WEIGHTS,
    family_of,
    flops_breakdown,
    lora_params,
    model_flops_per_token,
    model_weights,
    param_count,
)
from models import registry

CONFIGS = {
    "llama": lambda: tiny_model_configs.make_config("llama"),
    "llama_tied_bias": lambda: tiny_model_configs.make_config(
        "llama", tie_word_embeddings=True, attention_bias=True, mlp_bias=True
    ),
    "qwen2": lambda: tiny_model_configs.make_config("qwen2"),
    "qwen3": lambda: tiny_model_configs.make_config("qwen3"),
    "qwen3_moe": lambda: tiny_model_configs.make_config("qwen3_moe"),
    "qwen3_moe_step2": lambda: tiny_model_configs.make_config(
        "qwen3_moe", decoder_sparse_step=2, mlp_only_layers=[]
    ),
    "gemma2": lambda: gemma_tiny_configs.gemma_config("gemma2"),
    "gemma3": lambda: gemma_tiny_configs.gemma_config("gemma3"),
    "gpt_oss": gpt_oss_tiny.tiny_config,
    "phi3": phi3_tiny.phi3_config,
    "mistral": mistral_family_configs.mistral_config,
    "mixtral": mistral_family_configs.mixtral_config,
    "deepseek_v3": deepseek_config,
    "deepseek_v3_no_q_lora": lambda: deepseek_config(
        q_lora_rank=None, n_shared_experts=2, attention_bias=True
    ),
}


def test_every_registered_family_has_its_arithmetic_and_a_case_here():
    families = {entry.family for entry in registry.registered_architectures()}
    assert families <= set(FAMILY_WEIGHTS)
    assert families <= set(CONFIGS)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_param_count_equals_the_native_model(case):
    config = CONFIGS[case]()
    family = family_of(config)
    entry = next(e for e in registry.registered_architectures() if e.family == family)
    model = registry.load_class(entry)(config)
    built = sum(p.numel() for p in model.parameters())
    assert param_count(config) == built
    assert param_count(config.to_dict()) == built  # config.json form, as validation reads it


def test_unregistered_architecture_counts_llama_style():
    config = {"architectures": ["SomeNewForCausalLM"], "vocab_size": 100, "hidden_size": 8,
              "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 16}  # fmt: skip
    per_layer = 4 * 8 * 8 + 3 * 8 * 16 + 2 * 8
    assert family_of(config) is None
    assert param_count(config) == 2 * 100 * 8 + 3 * per_layer + 8


def test_counting_needs_no_torch():
    code = "import sys, jobs.recipe.plan.flops; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


DENSE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256}  # fmt: skip


def test_dense_multi_head_flops_by_hand():
    seq = 128
    # per layer: q, k, v, o 64x64 each; gate/up/down 64x256; lm_head 1000x64
    matmul = 2 * (4 * 64 * 64 + 3 * 64 * 256) + 1000 * 64
    attention = 2 * 2 * 4 * (16 + 16) * seq  # layers * 2 * heads * (qk + v) * seq
    assert model_flops_per_token(DENSE, seq) == 6 * matmul + 3 * attention


def test_gqa_flops_by_hand():
    gqa = {**DENSE, "num_key_value_heads": 1, "head_dim": 32}
    seq = 64
    q, kv = 4 * 32, 1 * 32
    per_layer = 64 * q + 2 * 64 * kv + q * 64 + 3 * 64 * 256
    expected = 6 * (2 * per_layer + 1000 * 64) + 3 * (2 * 2 * 4 * (32 + 32) * seq)
    assert model_flops_per_token(gqa, seq) == expected


def test_moe_flops_count_routed_experts_only():
    moe = {**DENSE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8,
           "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [0]}  # fmt: skip
    seq = 16
    attn = 4 * 64 * 64
    dense_mlp, sparse_mlp = 3 * 64 * 256, 64 * 8 + 2 * 3 * 64 * 32  # router + 2 of 8 experts
    expected = 6 * (2 * attn + dense_mlp + sparse_mlp + 1000 * 64) + 3 * (2 * 2 * 4 * 32 * seq)
    assert model_flops_per_token(moe, seq) == expected
    # the model holds all 8 experts: q/k norms too (Qwen3-MoE)
    experts_held = 8 * 3 * 64 * 32 + 64 * 8
    held = 2 * 1000 * 64 + 2 * (attn + 2 * 16 + 2 * 64) + dense_mlp + experts_held + 64
    assert param_count(moe) == held


def test_lora_flops_are_forward_and_input_gradient_of_the_base_plus_the_adapters():
    seq, rank = 32, 8
    lora = (rank, ["q_proj", "v_proj"], None)
    adapters = 2 * (rank * (64 + 64) + rank * (64 + 64))  # q and v are 64x64 in both layers
    matmul = 2 * (4 * 64 * 64 + 3 * 64 * 256) + 1000 * 64
    attention = 2 * 2 * 4 * 32 * seq
    assert model_flops_per_token(DENSE, seq, lora=lora) == 4 * matmul + 3 * attention + 6 * adapters
    full = model_flops_per_token(DENSE, seq)
    assert model_flops_per_token(DENSE, seq, lora=lora) < full
    parts = flops_breakdown(DENSE, seq, lora=lora)
    assert (parts.matmul, parts.adapters) == (4 * matmul, 6 * adapters)


def test_lora_all_linear_skips_lm_head_and_honours_globs_and_excludes():
    weights = model_weights(DENSE)
    every = 2 * (4 * 8 * (64 + 64) + 3 * 8 * (64 + 256))
    assert lora_params(weights, 8) == (every, every)
    attn_only = 2 * 4 * 8 * 128
    assert lora_params(weights, 8, ["*self_attn.*"])[0] == attn_only
    assert lora_params(weights, 8, None, ["down_proj"])[0] == every - 2 * 8 * (64 + 256)
