"""Trainer step throughput vs a plain transformers training loop (1 process, CPU).

Both train the same seeded Llama on the same mock batches (every token a label, no
padding) with AdamW and grad-norm clipping. The trainer runs its real loop in this
process (`trainer.setup.setup_run` + `trainer.finetune.train`, one-rank gloo group,
metrics written to a temp run dir); the baseline is `model(**batch, labels=...)`,
`backward`, `clip_grad_norm_`, `step`. Rounds alternate so both see the same machine
load; tokens/s is one step's tokens over the median step time after warm-up (robust to
load spikes from other processes). Prints both and the ratio (target >= 0.95).

    OMP_NUM_THREADS=1 python bench/bench_trainer_step.py [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

BATCH, SEQ, WARMUP = 8, 128, 3
MODEL = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
)


def recipe_for(model_dir: Path, steps: int) -> dict:
    return {
        "step_scheduler": {"max_steps": steps, "grad_accumulation_steps": 1, "num_epochs": 100},
        "rng": {"seed": 0},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model_dir),
            "dtype": "float32",
            "force_hf": True,
        },
        "distributed": {"strategy": "ddp"},
        "dataset": {
            "_target_": "tuneyard.datasets.MockDataset",
            "vocab_size": 512,
            "seq_length": SEQ,
            "num_samples": BATCH * (steps + 1),
        },
        "dataloader": {"batch_size": BATCH, "shuffle": False},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "clip_grad_norm": {"max_norm": 1.0},
        "checkpoint": {"enabled": False},
    }


def trainer_tokens_per_s(model_dir: Path, steps: int) -> float:
    from trainer.distributed import init_distributed
    from trainer.finetune import train
    from trainer.metrics import RunLog
    from trainer.setup import setup_run

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        run = setup_run(recipe_for(model_dir, steps), run_dir, init_distributed())
        log = RunLog(run_dir, is_rank0=True)
        train(run, log)
        log.close()
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return tokens_per_s([r["timestamp"] for r in records if r["kind"] == "train"])


def tokens_per_s(stamps: list[float]) -> float:
    """Tokens per median step time after warm-up (robust to load spikes on a shared CPU)."""
    steps = [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1 :], strict=False)]
    return BATCH * SEQ / statistics.median(steps)


def baseline_tokens_per_s(model_dir: Path, steps: int) -> float:
    from transformers import AutoModelForCausalLM

    from trainer.data.datasets import MockDataset

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = MockDataset(512, SEQ, num_samples=BATCH * (steps + 1))
    loader = torch.utils.data.DataLoader(
        data, batch_size=BATCH, collate_fn=lambda s: torch.tensor([x["input_ids"] for x in s])
    )
    stamps = []
    for _, ids in zip(range(steps), loader, strict=False):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())  # parity: the trainer reads the loss every step
        stamps.append(time.time())
    return tokens_per_s(stamps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from cli.demo_assets import build_tiny_llama

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_llama(Path(tmp) / "model", **MODEL)
        ratios = []
        for round_ in range(args.rounds):
            base = baseline_tokens_per_s(model_dir, args.steps)
            ours = trainer_tokens_per_s(model_dir, args.steps)
            ratios.append(ours / base)
            print(
                f"round {round_ + 1}: transformers loop {base:9.0f} tok/s   "
                f"trainer {ours:9.0f} tok/s   ratio {ours / base:.3f}"
            )
    print(f"median ratio trainer/transformers: {statistics.median(ratios):.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
