"""Phi-3 under tensor parallelism on 2 gloo ranks equals one process (logits, loss, grads).

The native split q/k/v and gate/up projections take the common dense plan: through the
trainer's `parallelize` (TP then FSDP2; plain and sequence parallel, tied and untied) and
through `hooks.tp_plan` alone on padded batches past longrope's original length (long
factors, partial rotary, sliding window). The Hugging Face class, whose projections are
fused, and a native config with residual dropout are refused by the plan rather than
sharded wrongly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from gloo_cases import assert_cases_pass_on_two_ranks
from phi3_tiny import phi3_config

from models import AutoModelForCausalLM
from models.hooks import tp_plan, tp_unsupported_reason

WORKER = Path(__file__).with_name("_phi3_worker.py")
CASES = [
    "trainer_tp:plain:0:0",  # plain TP, untied (rowwise o/down, colwise q/k/v, gate/up)
    "trainer_tp:phi4mini:1:1",  # longrope + partial rotary + tied, sequence parallel
    "plan:phi4mini:0",  # long factors in use (seq 40 > 32) + partial rotary, left padding
    "plan:window:1",  # sliding window 8 over 40 tokens, sequence parallel
]


def test_phi3_tensor_parallel_matches_single_process(tmp_path):
    assert_cases_pass_on_two_ranks(WORKER, CASES, tmp_path)


def test_fused_hugging_face_phi3_is_refused_by_the_dense_plan():
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(phi3_config())
    assert "not Llama-style" in tp_unsupported_reason(hf, 2)


def test_residual_dropout_is_refused_under_tensor_parallelism():
    model = AutoModelForCausalLM.from_config(phi3_config(resid_pdrop=0.1))
    assert model.tuneyard_backend == "native"
    assert "resid_pdrop 0.1" in tp_unsupported_reason(model, 2)
    with pytest.raises(ValueError, match="tensor parallelism unavailable: resid_pdrop"):
        tp_plan(model)
    plain = AutoModelForCausalLM.from_config(phi3_config())
    assert tp_unsupported_reason(plain, 2) is None
