"""The plan's memory estimate against measured peaks of real trainer runs.

A grid of Llama configs (three sizes; LoRA on/off; activation checkpointing on/off; 1 and 2
FSDP2 ranks) is trained for a few steps with `python -m trainer` (torchrun for 2 ranks) on
packed rows of exactly the sequence length. Each run's `finished` event carries every
rank's measured peak (CPU: the growth of the peak resident set over the trainer's start;
CUDA: `max_memory_allocated`); the estimate is `validate_job`'s
`plan.estimate.memory_per_rank_bytes.total` for the same recipe and resources. Printed per
config: estimate, measured (the largest rank), relative error; then the median and worst
absolute error. Run: `python bench/bench_estimate.py` (CPU, ~4 min on 2 cores) or
`python bench/bench_estimate.py --device cuda` on a GPU machine (2-rank configs run when
it has 2 GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = {  # hidden, layers, intermediate, heads, kv heads; vocab 8192 for all
    "S": (256, 4, 704, 4, 2),
    "M": (512, 6, 1408, 8, 4),
    "L": (768, 8, 2048, 12, 4),
}
VOCAB, SEQ, MICRO_BATCH = 8192, 256, 2


@dataclass(frozen=True)
class Case:
    size: str
    lora: bool
    ac: bool
    ranks: int

    @property
    def name(self) -> str:
        return f"{self.size}-{'lora' if self.lora else 'full'}-{'ac' if self.ac else 'noac'}-r{self.ranks}"


# A fractional grid: every size, each factor on and off, both rank counts.
GRID = [
    Case("S", False, False, 1),
    Case("S", True, False, 1),
    Case("S", False, True, 2),
    Case("S", True, True, 2),
    Case("M", False, False, 1),
    Case("M", False, True, 1),
    Case("M", True, False, 2),
    Case("M", False, False, 2),
    Case("L", False, False, 1),
    Case("L", True, True, 1),
    Case("L", False, True, 2),
    Case("L", True, False, 2),
]


# Configs the constants in jobs.recipe.plan.estimate were not fitted on (`--grid held-out`).
HELD_OUT = [Case("M", True, True, 1), Case("S", False, False, 2), Case("L", True, False, 1)]


def build_model(root: Path, size: str) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    from cli.demo_assets import build_tokenizer, tiny_llama_config

    directory = root / f"llama-{size}"
    if (directory / "config.json").exists():
        return directory
    hidden, layers, inter, heads, kv = SIZES[size]
    build_tokenizer(directory, vocab_size=512)
    torch.manual_seed(0)
    config = tiny_llama_config(
        VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=SEQ,
    )
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return directory


def recipe_for(case: Case, model: Path, data: Path, steps: int) -> dict:
    recipe = {
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model),
            "dtype": "float32",
        },
        "distributed": {"strategy": "fsdp2", "activation_checkpointing": case.ac},
        "dataset": {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(data),
            "max_seq_length": SEQ,
        },
        "packed_sequence": {"enabled": True, "packed_sequence_size": SEQ},
        "dataloader": {"batch_size": MICRO_BATCH},
        "step_scheduler": {"max_steps": steps, "grad_accumulation_steps": 1},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "checkpoint": {"enabled": False},
        "rng": {"seed": 0},
    }
    if case.lora:
        recipe["peft"] = {"dim": 8, "match_all_linear": True}
    return recipe


def estimate(recipe: dict, case: Case, device: str) -> dict:
    from jobs.recipe.validation import validate_job

    result = validate_job(recipe, resources={"nproc_per_node": case.ranks, "accelerator": device})
    if not result.valid:
        raise SystemExit(f"{case.name}: invalid recipe: {[e.to_dict() for e in result.errors]}")
    return result.plan["estimate"]["memory_per_rank_bytes"]


def measure(recipe: dict, case: Case, root: Path) -> list[int]:
    import yaml

    path, run_dir = root / f"{case.name}.yaml", root / "runs" / case.name
    path.write_text(yaml.safe_dump(recipe))
    shutil.rmtree(run_dir, ignore_errors=True)  # the logs append: start from none
    launcher = [sys.executable]
    if case.ranks > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={case.ranks}",
        ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TUNEYARD_DATA_ROOTS": str(root),
        "TUNEYARD_CHECKPOINT_ROOTS": str(root),
        "PYTHONPATH": str(REPO),
    }
    cmd = [*launcher, "-m", "trainer", "--recipe", str(path), "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise SystemExit(f"{case.name}: trainer failed\n{(proc.stdout + proc.stderr)[-3000:]}")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return next(e["peak_memory_bytes"] for e in events if e["event"] == "finished")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument(
        "--grid",
        choices=("fit", "held-out"),
        default="fit",
        help="the grid the constants were fitted on, or configs they were not",
    )
    parser.add_argument("--work", type=Path, help="reuse this directory for models and runs")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="take the peaks measured by an earlier run in --work (no training)",
    )
    args = parser.parse_args()
    root = args.work or Path(tempfile.mkdtemp(prefix="bench-estimate-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["TUNEYARD_DATA_ROOTS"] = os.environ["TUNEYARD_CHECKPOINT_ROOTS"] = str(root)
    from cli.demo_assets import write_instruction_jsonl

    data = write_instruction_jsonl(root / "train.jsonl", 2048)
    grid = GRID if args.grid == "fit" else HELD_OUT
    cases = [c for c in grid if not args.only or c.name in args.only.split(",")]
    if args.device == "cuda":
        import torch

        cases = [c for c in cases if c.ranks <= torch.cuda.device_count()]
    store = root / "measured.json"  # peaks by device, case and steps, for --reuse
    saved = json.loads(store.read_text()) if store.exists() else {}
    errors, start = [], time.perf_counter()
    print(
        f"{'config':<18}{'estimate MiB':>13}{'measured MiB':>13}{'error':>8}   estimate parts MiB"
    )
    for case in cases:
        recipe = recipe_for(case, build_model(root, case.size), data, args.steps)
        parts = estimate(recipe, case, args.device)
        key = f"{args.device}:{case.name}:{args.steps}"
        peaks = saved.get(key) if args.reuse else None
        if peaks is None:
            peaks = saved[key] = measure(recipe, case, root)
            store.write_text(json.dumps(saved, indent=1))
        measured = max(peaks)
        error = (parts["total"] - measured) / measured
        errors.append(abs(error))
        shown = " ".join(f"{k}={v / 2**20:.0f}" for k, v in parts.items() if k != "total")
        print(
            f"{case.name:<18}{parts['total'] / 2**20:>13.1f}{measured / 2**20:>13.1f}"
            f"{error:>+8.1%}   {shown}  ranks={[round(p / 2**20) for p in peaks]}",
            flush=True,
        )
    print(
        f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%} over "
        f"{len(errors)} configs ({args.device}, {time.perf_counter() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()
