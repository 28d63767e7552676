"""The hooks' sharding data, applied on 2 gloo ranks, matches one process.

Tensor parallelism (`tp_plan`, with and without sequence parallelism, native and Hugging
Face classes, tied and untied) and FSDP2 per `decoder_layers` (dense and MoE). Each case
starts two plain Python processes (gloo, CPU) running `_tp_worker.py`; logits, loss and
every gradient of the sharded model must equal the unsharded model's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("_tp_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = [
    "tp:hf:0:0",  # Hugging Face LlamaForCausalLM, plain TP
    "tp:hf:1:1",  # Hugging Face, sequence parallel, tied embeddings
    "tp:native:0:1",  # native, plain TP, tied
    "tp:native:1:0",  # native, sequence parallel, untied (rowwise embedding, colwise head)
    "fsdp:qwen3_moe",  # FSDP2 per decoder layer over grouped experts and the fp32 router
]


def test_sharding_hooks_match_single_process(tmp_path):
    """All cases in one pair of processes (imports dominate the cost)."""
    out, port = tmp_path / "result", str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", port, str(out), *CASES],
            env=env,
            cwd=ROOT,
        )
        for rank in range(2)
    ]
    for proc in procs:
        proc.wait(timeout=240)
    for rank in range(2):
        lines = (tmp_path / f"result.{rank}").read_text().splitlines()
        results = [line for line in lines if not line.startswith("    ")]
        assert [r.split()[0] for r in results] == CASES, lines
        failed = [line for line in lines if " FAILED " in line or line.startswith("    ")]
        assert not failed, f"rank {rank}:\n" + "\n".join(lines)
