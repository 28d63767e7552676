"""Context parallelism vs plain FSDP2: training tokens/s on the same ranks (CPU, gloo).

Both layouts run the trainer's benchmark recipe (`recipe: llm_benchmark`, the fine-tuning
loop's `train_step`) under `torchrun` on the same number of ranks, on the same seeded
native Llama and the same mock batches (every token a label), with the same global batch:
FSDP2 gives each rank its own rows (dp_shard = ranks, one row each), context parallelism
gives every rank a load-balanced half of each row (cp_size = ranks, dp 1), all-gathering
K/V in attention. Rounds alternate the two layouts so both see the same machine load;
each run's number is its `benchmark_summary` median tokens/s over the measured steps.
Prints every run, the medians, and the ratio CP / FSDP. Both layouts do the same matmul
work per rank; CP adds a K/V all-gather and a dK/dV reduce-scatter per layer and computes
the masked part of each chunk's diagonal key blocks, while each rank's attention runs over
half-length query chunks. What CP buys is a long row's activation memory split over ranks.

    OMP_NUM_THREADS=1 python bench/bench_context_parallel_throughput.py \
        [--seq 1024] [--ranks 2] [--rounds 2] [--measured 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_dropout=0.0,
)


def recipe_for(model_dir: Path, distributed: dict, ranks: int, seq: int, measured: int) -> dict:
    local = ranks if distributed.get("cp_size") else 1  # the same global batch: `ranks` rows
    return {
        "recipe": "llm_benchmark",
        "benchmark": {"warmup_steps": 2, "measured_steps": measured},
        "step_scheduler": {"global_batch_size": ranks, "local_batch_size": local},
        "rng": {"seed": 0},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model_dir),
            "dtype": "float32",
        },
        "distributed": distributed,
        "dataset": {
            "_target_": "tuneyard.datasets.MockDataset",
            "vocab_size": 512,
            "seq_length": seq,
            "num_samples": 4 * ranks,
        },
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "checkpoint": {"enabled": False},
    }


def run_layout(root: Path, name: str, recipe: dict, ranks: int) -> dict:
    """One torchrun of the trainer; its `benchmark_summary` event."""
    recipe_path, run_dir = root / f"{name}.yaml", root / "runs" / name
    recipe_path.write_text(yaml.safe_dump(recipe))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TUNEYARD_DATA_ROOTS": str(root),
        "TUNEYARD_CHECKPOINT_ROOTS": str(root),
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        "-m",
        "trainer",
        "--recipe",
        str(recipe_path),
        "--run-dir",
        str(run_dir),
    ]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    summary = next(e for e in events if e["event"] == "benchmark_summary")
    started = next(e for e in events if e["event"] == "started")
    tokens = {r["num_tokens"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())}
    return {
        "tps": summary["tokens_per_s"]["median"],
        "mesh": started["mesh_shape"],
        "tokens_per_step": sorted(tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measured", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from cli.demo_assets import build_tiny_llama

    layouts = {"fsdp2": {"strategy": "fsdp2"}, "cp": {"strategy": "fsdp2", "cp_size": args.ranks}}
    results: dict[str, list[float]] = {name: [] for name in layouts}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = build_tiny_llama(root / "model", max_position_embeddings=args.seq, **MODEL)
        for round_ in range(args.rounds):
            for name, distributed in layouts.items():
                recipe = recipe_for(model_dir, distributed, args.ranks, args.seq, args.measured)
                got = run_layout(root, f"{name}-{round_}", recipe, args.ranks)
                results[name].append(got["tps"])
                print(
                    f"round {round_} {name:5s} mesh {got['mesh']} tokens/step "
                    f"{got['tokens_per_step']}: {got['tps']:.0f} tokens/s",
                    flush=True,
                )
    fsdp, cp = statistics.median(results["fsdp2"]), statistics.median(results["cp"])
    print(f"seq {args.seq}, {args.ranks} ranks, global batch {args.ranks} rows")
    print(f"fsdp2 (dp_shard {args.ranks}): {fsdp:.0f} tokens/s (median of {args.rounds})")
    print(f"cp    (cp_size {args.ranks}):  {cp:.0f} tokens/s (median of {args.rounds})")
    print(f"ratio cp / fsdp2: {cp / fsdp:.3f}")


if __name__ == "__main__":
    main()
