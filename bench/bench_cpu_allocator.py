"""Step time and peak memory of a CPU training run with and without the worker's allocator setting.

`worker.launcher.CPU_ALLOCATOR_ENV` (a fixed glibc mmap threshold) is what keeps a CPU rank's
peak near what it holds; this prices it. The same 2-rank FSDP2 run (a seeded Llama, AdamW,
packed rows of the sequence length, no checkpoint) is launched with the worker's own
environment (`worker.launcher.build_env`), once as the worker sets it and once with the
allocator keys removed (glibc's defaults), in alternating rounds so both see the same load
from other processes. Printed per setting: the median step time after warm-up (from the
records' timestamps) and the highest rank's peak growth (`finished` event); then the ratio.

    python3 bench/bench_cpu_allocator.py [--rounds 3] [--steps 8] [--workdir DIR]
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
sys.path.insert(0, str(REPO))
SHAPE = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=256,
)
SEQ, WARMUP = 256, 2


def build_model(directory: Path) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    from cli.demo_assets import build_tokenizer, tiny_llama_config

    if not (directory / "config.json").exists():
        build_tokenizer(directory, vocab_size=512)
        torch.manual_seed(0)
        LlamaForCausalLM(tiny_llama_config(**SHAPE)).save_pretrained(directory)
    return directory


def recipe(root: Path, model: Path, steps: int) -> dict:
    return {
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model),
            "dtype": "float32",
        },
        "distributed": {"strategy": "fsdp2", "dp_size": 2},
        "dataset": {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(root / "train.jsonl"),
            "max_seq_length": SEQ,
        },
        "packed_sequence": {"enabled": True, "packed_sequence_size": SEQ},
        "dataloader": {"batch_size": 2},
        "step_scheduler": {"max_steps": steps, "grad_accumulation_steps": 1},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "checkpoint": {"enabled": False},
        "rng": {"seed": 0},
    }


def environment(root: Path, run_dir: Path, allocator: bool) -> dict[str, str]:
    """The worker's environment for a 2-rank CPU attempt, with or without the allocator keys."""
    from worker.launcher import CPU_ALLOCATOR_ENV, LaunchSpec, build_env

    base = {k: v for k, v in os.environ.items() if k not in CPU_ALLOCATOR_ENV}
    env = build_env(LaunchSpec("bench", 1, run_dir, nproc_per_node=2), base)
    if not allocator:
        env = {k: v for k, v in env.items() if k not in CPU_ALLOCATOR_ENV}
    env.update(OMP_NUM_THREADS="1", TUNEYARD_DATA_ROOTS=str(root))
    env["TUNEYARD_CHECKPOINT_ROOTS"] = str(root)
    return env


def run_once(root: Path, model: Path, steps: int, name: str, allocator: bool) -> tuple[float, int]:
    """(median step seconds after warm-up, highest rank's peak growth in bytes)."""
    from worker.launcher import torchrun_prefix

    run_dir = root / "runs" / name
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe(root, model, steps)))
    command = [*torchrun_prefix(), "--standalone", "--nproc_per_node=2", "-m", "trainer"]
    command += ["--recipe", str(path), "--run-dir", str(run_dir)]
    env = environment(root, run_dir, allocator)
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    stamps = [r["timestamp"] for r in map(json.loads, lines) if r["kind"] == "train"]
    steps_s = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][WARMUP - 1 :]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    peak = max(next(e for e in events if e["event"] == "finished")["peak_memory_bytes"])
    return statistics.median(steps_s), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    from cli.demo_assets import write_instruction_jsonl
    from worker.launcher import CPU_ALLOCATOR_ENV

    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cpu-allocator-"))
    root.mkdir(parents=True, exist_ok=True)
    write_instruction_jsonl(root / "train.jsonl", n=512)
    model = build_model(root / "llama")
    results: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for index in range(args.rounds):
        for allocator in (False, True):
            tag = "worker" if allocator else "glibc"
            results[allocator].append(
                run_once(root, model, args.steps, f"{tag}-{index}", allocator)
            )
    print(f"2 gloo FSDP2 ranks, AdamW, seq {SEQ}; {args.rounds} rounds of {args.steps} steps")
    print(f"{'allocator':<34}{'step s':>9}{'peak MiB':>10}")
    medians = {}
    for allocator, label in ((False, "glibc default"), (True, f"worker {CPU_ALLOCATOR_ENV}")):
        step = statistics.median(s for s, _ in results[allocator])
        peak = statistics.median(p for _, p in results[allocator])
        medians[allocator] = (step, peak)
        print(f"{label:<34}{step:>9.3f}{peak / 2**20:>10.0f}")
    (on_step, on_peak), (off_step, off_peak) = medians[True], medians[False]
    print(f"{'worker / glibc':<34}{on_step / off_step:>9.3f}{on_peak / off_peak:>10.3f}")


if __name__ == "__main__":
    main()
