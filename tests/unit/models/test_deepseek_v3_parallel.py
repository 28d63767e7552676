"""DeepSeek-V3 expert and tensor parallelism on 2 gloo ranks match one process.

Two plain Python processes run `_deepseek_v3_worker.py`: expert parallelism through
`models.hooks.apply_expert_parallel` alone and through the trainer's `parallelize`
(ep_size 2, FSDP2 on the rest, gradient-norm clipping), then tensor parallelism through
the trainer's `parallelize` (tp_size 2 then FSDP2) with and without sequence parallelism
and with and without a q LoRA rank. Logits, loss and every gradient (the router, the
correction-bias-routed experts, the shared rotary key's projection) must equal the
unsharded model's. Single-process refusals are tested here too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _deepseek_v3_worker import tiny_config
from gloo_cases import assert_cases_pass_on_two_ranks

from models import AutoModelForCausalLM
from models.hooks import ep_unsupported_reason, tp_unsupported_reason

WORKER = Path(__file__).with_name("_deepseek_v3_worker.py")


def test_expert_and_tensor_parallel_match_single_process(tmp_path):
    cases = ["ep_hooks", "ep_trainer", "tp:0:1", "tp:1:1", "tp:1:0"]
    assert_cases_pass_on_two_ranks(WORKER, cases, tmp_path)


def test_refusals_name_the_problem():
    model = AutoModelForCausalLM.from_config(tiny_config())
    assert ep_unsupported_reason(model, 2) is None
    assert "not divisible by ep_size 3" in ep_unsupported_reason(model, 3)
    assert tp_unsupported_reason(model, 2) is None
    assert "divisible by tp_size 3" in tp_unsupported_reason(model, 3)
    dense = AutoModelForCausalLM.from_config(tiny_config(first_k_dense_replace=2))
    assert "no grouped experts" in ep_unsupported_reason(dense, 2)
    hf = AutoModelForCausalLM.from_config(tiny_config(), force_hf=True)
    assert "not the native latent-attention class" in tp_unsupported_reason(hf, 2)


def test_lora_wrapped_attention_refuses_tp():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config())
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["kv_b_proj"]))
    assert "LoRA-wrapped" in tp_unsupported_reason(peft_model, 2)
