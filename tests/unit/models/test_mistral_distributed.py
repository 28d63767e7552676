"""Mistral tensor parallelism and Mixtral expert parallelism on 2 gloo ranks match one process.

Two plain Python processes run `_mistral_worker.py`: native Mistral through the trainer's
`parallelize` with tp_size 2 (with and without sequence parallelism, tied and untied, on
padded inputs longer than the sliding window), and Mixtral with its experts spread over
the two ranks (the hooks path alone, then the trainer's `parallelize` with FSDP2, loss
scaling and gradient-norm clipping). Logits, loss and every gradient must equal the
unsharded model's. Single-process refusals (no TP plan for Mixtral's experts, EP sizes that
do not divide the experts) are checked here too.
"""

from __future__ import annotations

from pathlib import Path

import torch
from gloo_cases import assert_cases_pass_on_two_ranks
from mistral_family_configs import mistral_config, mixtral_config

from models import AutoModelForCausalLM
from models.hooks import ep_unsupported_reason, tp_unsupported_reason

WORKER = Path(__file__).with_name("_mistral_worker.py")
CASES = ["tp:1:0", "tp:0:1", "ep_hooks", "ep_trainer"]


def test_tp_and_ep_match_single_process(tmp_path):
    assert_cases_pass_on_two_ranks(WORKER, CASES, tmp_path)


def test_plans_refuse_what_they_cannot_shard():
    torch.manual_seed(0)
    mixtral = AutoModelForCausalLM.from_config(mixtral_config())
    assert ep_unsupported_reason(mixtral, 2) is None
    assert "not divisible by ep_size 3" in ep_unsupported_reason(mixtral, 3)
    assert "not Llama-style" in tp_unsupported_reason(mixtral, 2)
    mistral = AutoModelForCausalLM.from_config(mistral_config())
    assert tp_unsupported_reason(mistral, 2) is None
    assert "no grouped experts" in ep_unsupported_reason(mistral, 2)
