"""Consolidated checkpoint save vs `model.save_pretrained`: time and peak extra memory.

Each measurement runs in a fresh subprocess (so allocator caches do not carry over): it
builds the same seeded Llama (~130 MB of float32 weights), records RSS, then saves either
with `trainer.checkpoint.consolidate.save_consolidated_model` (one tensor at a time) or
with `save_pretrained`, while a thread samples RSS every millisecond. Rounds alternate.
Prints time ratio (target <= 1.2) and peak extra RSS as a multiple of the model's bytes
(target <= 1.25).

    OMP_NUM_THREADS=1 python bench/bench_checkpoint_save.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MODEL = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
)


def measure(kind: str, out_dir: Path) -> dict:
    import psutil
    import torch
    from transformers import LlamaForCausalLM

    from cli.demo_assets import tiny_llama_config
    from trainer.checkpoint.consolidate import save_consolidated_model

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(**MODEL))
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    process, peak, done = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.001)

    before = process.memory_info().rss
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    if kind == "trainer":
        save_consolidated_model(model, out_dir, is_rank0=True)
    else:
        model.save_pretrained(out_dir)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return {"seconds": seconds, "extra_rss": max(0, peak[0] - before), "model_bytes": model_bytes}


def run_child(kind: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, tmp],
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], Path(args.child[1]) / "out")))
        return
    ratios, extras = [], []
    for round_ in range(args.rounds):
        base, ours = run_child("save_pretrained"), run_child("trainer")
        ratios.append(ours["seconds"] / base["seconds"])
        extras.append(ours["extra_rss"] / ours["model_bytes"])
        mb = ours["model_bytes"] / 2**20
        print(
            f"round {round_ + 1}: model {mb:.0f} MiB | save_pretrained {base['seconds']:.3f} s "
            f"extra RSS {base['extra_rss'] / 2**20:6.1f} MiB | trainer {ours['seconds']:.3f} s "
            f"extra RSS {ours['extra_rss'] / 2**20:6.1f} MiB | time ratio {ratios[-1]:.2f}"
        )
    print(
        f"median time ratio trainer/save_pretrained: {statistics.median(ratios):.2f} "
        f"(target <= 1.2); peak extra RSS / model bytes: {max(extras):.2f} (target <= 1.25)"
    )


if __name__ == "__main__":
    main()
