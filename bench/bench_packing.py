"""Benchmark: training throughput in real (non-pad) tokens/s, packed rows vs padded batches.

One length-skewed dataset (lengths drawn log-normally, clipped to [--min-len, --max-len]),
one tiny native Llama (`models.auto.AutoModelForCausalLM`, float32), two copies of the same
initial weights, each with its own AdamW. Padded: batches of `--batch` samples in dataset
order, padded to their longest sample (what tuneyard's Collator does without packing).
Packed: the same samples packed greedily into rows of `--pack` tokens (`PackedDataset`),
`--batch` rows per step. Both modes pass over exactly the same samples, so the same real
tokens; a step is the trainer's (`model_logits`, summed token loss, backward, AdamW step).
Batches are collated before timing; `--warmup` steps of each mode run untimed first; the
two passes then run interleaved step by step, `--rounds` times, so machine noise hits both.
Wall-clock and process CPU time are both reported: on a shared machine the CPU-time rate
is the steadier measure.
Prints each mode's real tokens/s, its padding efficiency (real tokens / row slots), its
slots/s (all positions, pad included: the per-step cost apart from padding) and the ratio
packed/padded of real tokens/s.

    OMP_NUM_THREADS=2 python bench/bench_packing.py [--samples 160] [--rounds 2]
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.demo_assets import tiny_llama_config  # noqa: E402
from trainer.data.collate import Collator, PackedDataset  # noqa: E402
from trainer.forward import model_logits  # noqa: E402
from trainer.loss import MaskedCrossEntropy, token_loss_sum  # noqa: E402

CPU = torch.device("cpu")


def skewed_samples(args: argparse.Namespace) -> list[dict[str, list[int]]]:
    """Log-normal lengths in [min_len, max_len]; the first third of each sample is prompt."""
    rng = random.Random(args.seed)
    samples = []
    for _ in range(args.samples):
        n = int(
            min(args.max_len, max(args.min_len, rng.lognormvariate(math.log(args.median), 1.0)))
        )
        prompt = n // 3
        ids = [rng.randrange(3, args.vocab) for _ in range(n)]
        samples.append({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (n - prompt)})
    return samples


def batches(samples: list, collator: Collator, size: int) -> list[dict[str, Any]]:
    return [collator(samples[i : i + size]) for i in range(0, len(samples), size)]


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from models.auto import AutoModelForCausalLM

    config = tiny_llama_config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        max_position_embeddings=args.max_len,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    assert type(model).__module__ == "models.llama.model", "the native Llama, not transformers'"
    return model.train()


class Trainer:
    """One model copy, its optimizer, and the trainer's step."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.loss_fn = MaskedCrossEntropy()

    def step(self, batch: dict[str, Any]) -> None:
        logits = model_logits(self.model, batch, CPU)
        labels = int((batch["labels"] != -100).sum())
        (token_loss_sum(self.loss_fn, logits, batch["labels"]) / labels).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed_step(self, batch: dict[str, Any]) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        self.step(batch)
        return time.perf_counter() - wall, time.process_time() - cpu


def interleaved(data: dict[str, list[dict[str, Any]]]) -> list[tuple[str, int]]:
    """Every step of every mode, ordered by how far through its pass each one is: the modes
    progress side by side, so a burst of load on the machine hits both alike."""
    steps = [
        ((i + 0.5) / len(batches), mode, i)
        for mode, batches in data.items()
        for i in range(len(batches))
    ]
    return [(mode, i) for _, mode, i in sorted(steps)]


def real_tokens(data: list[dict[str, Any]]) -> int:
    return sum(b["num_tokens"] for b in data)


def slots(data: list[dict[str, Any]]) -> int:
    return sum(b["input_ids"].numel() for b in data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--median", type=float, default=48.0, help="log-normal median length")
    parser.add_argument("--pack", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    samples = skewed_samples(args)
    data = {
        "padded": batches(samples, Collator(0), args.batch),
        "packed": batches(
            list(PackedDataset(samples, args.pack)), Collator(0, packed=True), args.batch
        ),
    }
    assert real_tokens(data["padded"]) == real_tokens(data["packed"])
    model = build_model(args)
    trainers = {mode: Trainer(copy.deepcopy(model)) for mode in data}
    lengths = sorted(len(s["input_ids"]) for s in samples)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"native Llama {params / 1e3:.0f}K params (h={args.hidden} L={args.layers} "
        f"vocab={args.vocab}), float32, threads={torch.get_num_threads()}; "
        f"{len(samples)} samples, lengths {lengths[0]}..{lengths[-1]} "
        f"(median {lengths[len(lengths) // 2]}), {real_tokens(data['padded'])} real tokens"
    )
    for mode, trainer in trainers.items():
        for batch in data[mode][: args.warmup]:
            trainer.step(batch)
    elapsed = {mode: [0.0, 0.0] for mode in data}  # wall, process CPU seconds
    schedule = interleaved(data)
    for _ in range(args.rounds):
        for mode, i in schedule:
            for clock, seconds in enumerate(trainers[mode].timed_step(data[mode][i])):
                elapsed[mode][clock] += seconds
    report(data, elapsed, args.rounds)


def report(data: dict[str, list], elapsed: dict[str, list[float]], rounds: int) -> None:
    print(
        f"{'mode':7s} {'steps':>6s} {'pad eff':>8s} {'clock':>5s} {'seconds':>8s} "
        f"{'slots/s':>9s} {'real tok/s':>11s}"
    )
    rate: dict[tuple[str, int], float] = {}
    for mode in ("padded", "packed"):
        efficiency = real_tokens(data[mode]) / slots(data[mode])
        for clock, name in enumerate(("wall", "cpu")):
            seconds = elapsed[mode][clock]
            rate[mode, clock] = real_tokens(data[mode]) * rounds / seconds
            print(
                f"{mode:7s} {len(data[mode]):6d} {efficiency:8.1%} {name:>5s} {seconds:8.2f} "
                f"{rate[mode, clock] / efficiency:9.0f} {rate[mode, clock]:11.0f}"
            )
    for clock, name in enumerate(("wall", "cpu")):
        ratio = rate["packed", clock] / rate["padded", clock]
        print(f"packed/padded real tokens/s ({name} clock): {ratio:.2f}x")


if __name__ == "__main__":
    main()
