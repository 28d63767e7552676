"""Pipeline-parallel throughput vs plain FSDP2 on the same CPU ranks (torchrun, gloo).

Both runs train the same seeded native Llama on the same mock batches (every token a
label) with the same global batch, through the real trainer under `torchrun` on 2 CPU
ranks: plain FSDP2 (dp_shard 2, each rank half the batch) and `pp_size: 2` (one stage
of half the layers per rank, the whole batch split into `--microbatch`-row micro-batches
by the chosen schedule). Rounds alternate the two so both see the same machine load;
tokens/s is one step's tokens over the median step time after warm-up (from the run's
metrics.jsonl timestamps). Prints both and the ratio PP / FSDP2.

    python bench/bench_pipeline_throughput.py [--steps 12] [--rounds 2] [--schedule 1f1b]
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
BATCH, SEQ, WARMUP, RANKS = 8, 128, 3, 2
MODEL = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
)


def recipe_for(model_dir: Path, steps: int, distributed: dict, dp: int) -> dict:
    return {
        "step_scheduler": {"max_steps": steps, "global_batch_size": BATCH, "num_epochs": 100},
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
            "seq_length": SEQ,
            "num_samples": BATCH * (steps + 1),
        },
        "dataloader": {"shuffle": False, "batch_size": BATCH // dp},  # one batch per step
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "clip_grad_norm": {"max_norm": 1.0},
        "checkpoint": {"enabled": False},
    }


def run_tokens_per_s(root: Path, name: str, recipe: dict) -> float:
    """Launch the trainer on RANKS gloo ranks; tokens/s of its median step."""
    recipe_path, run_dir = root / f"{name}.yaml", root / name
    recipe_path.write_text(yaml.safe_dump(recipe))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TUNEYARD_DATA_ROOTS": str(root),
        "TUNEYARD_CHECKPOINT_ROOTS": str(root),
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={RANKS}",
        "-m",
        "trainer",
        "--recipe",
        str(recipe_path),
        "--run-dir",
        str(run_dir),
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stamps = [r["timestamp"] for r in records if r["kind"] == "train"]
    steps = [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1 :], strict=False)]
    return BATCH * SEQ / statistics.median(steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--microbatch", type=int, default=2)
    args = parser.parse_args()
    from cli.demo_assets import build_tiny_llama

    fsdp = {"strategy": "fsdp2"}
    pipeline = {"pp_schedule": args.schedule, "pp_microbatch_size": args.microbatch}
    pp = {"strategy": "fsdp2", "pp_size": RANKS, "pipeline": pipeline}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = build_tiny_llama(root / "model", **MODEL)
        ratios = []
        for round_ in range(args.rounds):
            plain_recipe = recipe_for(model_dir, args.steps, fsdp, dp=RANKS)
            plain = run_tokens_per_s(root, f"fsdp-{round_}", plain_recipe)
            piped = run_tokens_per_s(root, f"pp-{round_}", recipe_for(model_dir, args.steps, pp, 1))
            ratios.append(piped / plain)
            print(
                f"round {round_ + 1}: fsdp2 dp_shard {RANKS} {plain:9.0f} tok/s   "
                f"pp {RANKS} ({args.schedule}, {BATCH // args.microbatch} micro-batches) "
                f"{piped:9.0f} tok/s   ratio {piped / plain:.3f}"
            )
    print(f"median ratio pp/fsdp2 on {RANKS} CPU ranks: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
