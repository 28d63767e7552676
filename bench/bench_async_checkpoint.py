"""Step-time stall of a checkpoint save: synchronous vs `checkpoint.is_async`, side by side.

One process, one seeded Llama (~32M parameters, ~126 MB of float32 weights plus ~250 MB
of AdamW state) training on random tokens. Each round trains `--steps` steps twice, once
saving synchronously and once asynchronously at step `--save-at`, through the trainer's
own `finetune.save_checkpoint` and `CheckpointManager` (a one-process gloo group, as
`python -m trainer` forms). Warm-up steps run first and are not measured. The stall of a
mode is how long the save held the step loop (the step that saves, less its training):
the whole save when synchronous; the snapshot (CPU copies of the optimizer state and of
the gathered model) when asynchronous. The median step time before and after the save
shows what the background write costs the steps it overlaps (it shares the CPU cores);
the end-of-run wait for a save still in flight is printed apart. Prints both stalls and
their ratio per round, and the medians.

    OMP_NUM_THREADS=1 python bench/bench_async_checkpoint.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
)


class _Log:
    def event(self, name: str, step: int, **fields: Any) -> None:
        pass


def build_run(root: Path, is_async: bool) -> SimpleNamespace:
    import torch
    from transformers import LlamaForCausalLM

    from cli.demo_assets import tiny_llama_config
    from trainer.checkpoint.manager import CheckpointManager
    from trainer.resilience import fingerprint

    # The resume fingerprint's probe needs the run's data loader, which this bench has not:
    # its one forward on two rows is left out (the digests, the save's real cost, stay).
    fingerprint.probe_loss = lambda run: None
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(**MODEL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    recipe = SimpleNamespace(model={}, to_json=lambda: {})
    return SimpleNamespace(
        model=model,
        optimizer=optimizer,
        scheduler=None,
        recipe=recipe,
        tokenizer=None,
        checkpoints=CheckpointManager(root, True, keep_last=1, is_async=is_async),
        env=SimpleNamespace(is_rank0=True, world_size=1, rank=0),
        topology=SimpleNamespace(dp_size=1, mesh_shape=lambda: {"dp_shard": 1}),
        data_state={"epoch": 0, "batches_done": 0},
        architecture="LlamaForCausalLM",
        is_peft=False,
        step=0,
        max_steps=10**9,
        skipped_batches=set(),
        pipeline=None,
    )


def train_step(run: SimpleNamespace, ids: Any) -> None:
    loss = run.model(input_ids=ids, labels=ids).loss
    loss.backward()
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.step += 1


def measure(is_async: bool, steps: int, save_at: int, warmup: int) -> dict[str, float]:
    import torch

    from trainer.finetune import save_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(Path(tmp), is_async)
        ids = torch.randint(0, MODEL["vocab_size"], (2, 128), generator=torch.Generator())
        for _ in range(warmup):
            train_step(run, ids)
        times, blocking = [], 0.0
        for index in range(1, steps + 1):
            start = time.perf_counter()
            train_step(run, ids)
            if index == save_at:
                saving = time.perf_counter()
                save_checkpoint(run, _Log(), {"step": run.step}, final=False)
                blocking = time.perf_counter() - saving
            times.append(time.perf_counter() - start)
        waiting = time.perf_counter()
        run.checkpoints.wait()
        end_wait = time.perf_counter() - waiting
        assert run.checkpoints.latest() is not None
    before, after = times[: save_at - 1], times[save_at:]
    return {
        "stall": blocking,
        "before": statistics.median(before),
        "after": statistics.median(after),
        "end_wait": end_wait,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--save-at", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    from trainer.distributed import init_distributed, shutdown

    init_distributed()
    ratios, stalls = [], {"sync": [], "async": []}
    try:
        for round_ in range(args.rounds):
            results = {}
            for mode in ("sync", "async"):
                results[mode] = measure(mode == "async", args.steps, args.save_at, args.warmup)
                stalls[mode].append(results[mode]["stall"])
            ratios.append(results["sync"]["stall"] / max(results["async"]["stall"], 1e-3))
            line = " | ".join(
                f"{m}: stall {r['stall']:.3f} s (median step before/after the save "
                f"{r['before']:.3f}/{r['after']:.3f} s, end wait {r['end_wait']:.3f} s)"
                for m, r in results.items()
            )
            print(f"round {round_ + 1}: {line} | sync/async stall {ratios[-1]:.1f}x", flush=True)
    finally:
        shutdown()
    print(
        f"median stall: sync {statistics.median(stalls['sync']):.3f} s, "
        f"async {statistics.median(stalls['async']):.3f} s; "
        f"sync/async {statistics.median(ratios):.1f}x"
    )


if __name__ == "__main__":
    main()
