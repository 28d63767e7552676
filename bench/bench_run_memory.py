"""Per-rank peak memory of a whole FSDP2 training run and of its resume: full vs shard-only load.

The measurement the parallelism issue describes: a ~60M-parameter Llama on 2 gloo FSDP2
ranks with plain SGD (no optimizer state), load, 2 steps, one save; then a resume from that
save. Each run is the real trainer under `torchrun`; its `started` and `finished` events
(`resumed` for a resume) carry every rank's peak memory growth over the run's start (CPU:
`VmHWM`). The same runs
with a tiny Llama are subtracted (the fixed cost of the code paths), and what is left is
printed as a multiple of the big model's fp32 bytes, the highest rank counting: full load
(`TUNEYARD_FULL_MODEL_LOAD=1`: every rank builds the whole model, then shards it) beside the
shard-only load (the default), for the load alone, the whole fresh run, the resume's load
and the whole resumed run. Every run gets the worker's environment for a CPU attempt
(`worker.launcher.build_env`, its allocator setting included); `--glibc-defaults` removes
the allocator setting, to show what it buys. The target: the default path's run and resumed
run each at most 2.0x.

    OMP_NUM_THREADS=1 python3 bench/bench_run_memory.py [--workdir DIR] [--glibc-defaults]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BIG = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def build_model(directory: Path, shape: dict) -> int:
    """A seeded Llama with a small BPE tokenizer; returns its fp32 bytes."""
    import torch
    from transformers import LlamaForCausalLM

    from cli.demo_assets import build_tokenizer, tiny_llama_config

    build_tokenizer(directory, vocab_size=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(**shape))
    model.save_pretrained(directory, safe_serialization=True)
    return sum(p.numel() for p in model.parameters()) * 4


def recipe(root: Path, model: Path, max_steps: int, restore: Path | None) -> dict:
    out = {
        "step_scheduler": {
            "max_steps": max_steps,
            "global_batch_size": 4,
            "checkpoint_interval": 2,
            "val_check_interval": None,
        },
        "rng": {"seed": 7},
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model),
            "dtype": "float32",
        },
        "distributed": {"strategy": "fsdp2", "dp_size": 2},
        "dataset": {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(root / "train.jsonl"),
            "max_seq_length": 64,
        },
        "dataloader": {"batch_size": 2},
        "optimizer": {"_target_": "torch.optim.SGD", "lr": 1e-3},
    }
    if restore is not None:
        out["restore_from"] = {"path": str(restore)}
    return out


def worker_env(run_dir: Path, allocator: bool) -> dict[str, str]:
    """What the worker gives a 2-rank CPU attempt (without the allocator keys on request)."""
    from worker.launcher import CPU_ALLOCATOR_ENV, LaunchSpec, build_env

    base = {k: v for k, v in os.environ.items() if allocator or k not in CPU_ALLOCATOR_ENV}
    env = build_env(LaunchSpec("bench", 1, run_dir, nproc_per_node=2), base)
    return env if allocator else {k: v for k, v in env.items() if k not in CPU_ALLOCATOR_ENV}


def run(root: Path, name: str, body: dict, full_load: bool, allocator: bool) -> tuple[int, int]:
    """One 2-rank run; (highest rank's peak at `started`/`resumed`, at `finished`), bytes."""
    path, run_dir = root / f"{name}.yaml", root / "runs" / name
    path.write_text(yaml.safe_dump(body))
    shutil.rmtree(run_dir, ignore_errors=True)  # the logs append: start from none
    env = {
        **worker_env(run_dir, allocator),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "TUNEYARD_DATA_ROOTS": str(root),
        "TUNEYARD_CHECKPOINT_ROOTS": str(root),
        "TUNEYARD_FULL_MODEL_LOAD": "1" if full_load else "0",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "trainer",
        "--recipe",
        str(path),
        "--run-dir",
        str(run_dir),
    ]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    peak = {e["event"]: max(e["peak_memory_bytes"]) for e in events if "peak_memory_bytes" in e}
    return peak.get("started", peak.get("resumed", 0)), peak["finished"]


def measure(
    root: Path, model: Path, tag: str, full_load: bool, allocator: bool
) -> tuple[int, int, int, int]:
    """(load, whole fresh run, resume load, whole resumed run) peaks of one model, one path."""
    mode = "full" if full_load else "shard"
    load, whole = run(root, f"{tag}-{mode}", recipe(root, model, 2, None), full_load, allocator)
    saved = root / "runs" / f"{tag}-{mode}" / "checkpoints" / "step_2"
    body = recipe(root, model, 3, saved)
    resume, resumed = run(root, f"{tag}-{mode}-resume", body, full_load, allocator)
    return load, whole, resume, resumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave out the worker's allocator setting (worker.launcher.CPU_ALLOCATOR_ENV)",
    )
    args = parser.parse_args()
    allocator = not args.glibc_defaults
    from cli.demo_assets import write_instruction_jsonl

    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-run-memory-"))
    root.mkdir(parents=True, exist_ok=True)
    write_instruction_jsonl(root / "train.jsonl", n=64)
    model_bytes = build_model(root / "big", BIG)
    build_model(root / "tiny", TINY)
    print(
        f"Llama {model_bytes / 4 / 1e6:.1f}M params ({model_bytes / 2**20:.0f} MiB fp32), "
        "2 gloo FSDP2 ranks, SGD, 2 steps + one save, then a resume; growth over a tiny "
        "model's run, highest rank, x the model's fp32 bytes; "
        + ("glibc's allocator defaults" if args.glibc_defaults else "the worker's environment")
    )
    print(f"{'path':<12}{'load':>8}{'run':>8}{'resume':>8}{'resumed run':>13}")
    rows, raw = {}, {}
    for full_load in (True, False):
        big = measure(root, root / "big", "big", full_load, allocator)
        tiny = measure(root, root / "tiny", "tiny", full_load, allocator)
        rows[full_load] = [(b - t) / model_bytes for b, t in zip(big, tiny, strict=True)]
        raw[full_load] = [b / model_bytes for b in big]
        label = "full load" if full_load else "shard-only"
        print(f"{label:<12}" + "".join(f"{x:>8.2f}" for x in rows[full_load][:3]), end="")
        print(f"{rows[full_load][3]:>13.2f}")
    ratios = [s / f if f else float("nan") for s, f in zip(rows[False], rows[True], strict=True)]
    print(f"{'shard/full':<12}" + "".join(f"{x:>8.2f}" for x in ratios[:3]) + f"{ratios[3]:>13.2f}")
    run_x, resumed_x = rows[False][1], rows[False][3]
    verdict = "meets" if max(run_x, resumed_x) <= 2.0 else "misses"
    print(
        f"default (shard-only): whole run {run_x:.2f}x, resumed run {resumed_x:.2f}x: {verdict} "
        f"the 2.0x target (without subtracting the tiny run: {raw[False][1]:.2f}x, "
        f"{raw[False][3]:.2f}x)"
    )


if __name__ == "__main__":
    main()
