"""The plan's memory estimate against measured peaks of real trainer runs, on two grids.

Two grids of Llama configs, each trained for a few steps as the worker runs a job (torchrun
with the worker's environment, `worker.launcher.build_env`, whose CPU allocator setting is
part of what a user sees) on packed rows of exactly the sequence length:

- `FIT`: the configs the constants in `jobs.recipe.plan.memory_model` were fitted on.
- `HELD_OUT`: chosen before fitting and never tuned on: other hidden sizes, depths,
  vocabulary, sequence lengths and micro-batches, ranks 1/2/4, LoRA, activation
  checkpointing, and a save (with a validation pass) inside the run.
- `HELD_OUT_2`: a second such grid, written after one constant had been refitted (on FIT)
  following a look at HELD_OUT's errors, so that one grid was never seen before its figures.
- `HELD_OUT_3`: a third such grid, written and measured before the LoRA and logits terms
  were reworked on the three grids above (all fit data since), then estimated once after.
- `HELD_OUT_4`: a fourth such grid, written and measured before the LoRA head/loss term was
  derived from the four grids above (all fit data since), then estimated once after.

Each run's `finished` event carries every rank's measured peak (CPU: the growth of the
peak resident set over the trainer's start; CUDA: `max_memory_allocated`); the estimate is
`validate_job`'s `plan.estimate.memory_per_rank_bytes.total` for the same recipe and
resources. Printed per config: estimate, measured (the largest rank), relative error; then
per grid the median and worst absolute error (target on the held-out grid: median <= 10%,
worst <= 20%). Peaks are kept in `<work>/measured.json`; `--reuse` re-estimates them
without training. 46 short runs: about 30 minutes on 2 busy CPU cores.

    python3 bench/bench_estimate.py [--grid fit|held-out|...|held-out-4|both|all] [--work DIR] [--reuse]
    python3 bench/bench_estimate.py --device cuda   # on a GPU machine (ranks <= its GPUs)
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


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def name(self) -> str:
        return f"h{self.hidden}x{self.layers}v{self.vocab}"


@dataclass(frozen=True)
class Case:
    shape: Shape
    lora: bool
    ac: bool
    ranks: int
    seq: int = 256
    batch: int = 2
    save: bool = False  # a save (and a validation pass) at step 2 and at the end

    @property
    def name(self) -> str:
        parts = [
            self.shape.name,
            "lora" if self.lora else "full",
            "ac" if self.ac else "noac",
            f"r{self.ranks}",
            f"s{self.seq}b{self.batch}",
        ]
        return "-".join(parts + (["save"] if self.save else []))


S, M, L = (
    Shape(256, 4, 704, 4, 2, 8192),
    Shape(512, 6, 1408, 8, 4, 8192),
    Shape(768, 8, 2048, 12, 4, 8192),
)
FIT = [
    Case(S, False, False, 1),
    Case(S, True, False, 1),
    Case(S, False, True, 2, save=True),
    Case(S, False, False, 4, save=True),
    Case(M, False, False, 1, save=True),
    Case(M, False, True, 1, seq=512, batch=1),
    Case(M, False, False, 2, seq=64, batch=4),
    Case(M, True, True, 4),
    Case(L, True, True, 1, save=True),
    Case(L, True, False, 2, save=True),
]
# Chosen before the constants were fitted, and never fitted on: every shape, sequence
# length, micro-batch and vocabulary differs from FIT's.
H1 = Shape(384, 5, 1024, 6, 2, 12000)
H2 = Shape(640, 7, 1728, 10, 2, 12000)
H3 = Shape(896, 3, 2432, 14, 2, 12000)
HELD_OUT = [
    Case(H1, False, False, 1, seq=128, batch=3, save=True),
    Case(H1, True, True, 2, seq=384, batch=1),
    Case(H1, False, True, 4, seq=128, batch=1, save=True),
    Case(H2, False, False, 2, seq=384, batch=1, save=True),
    Case(H2, True, False, 1, seq=128, batch=3),
    Case(H2, True, True, 4, seq=128, batch=3, save=True),
    Case(H3, False, True, 1, seq=384, batch=1),
    Case(H3, True, False, 2, seq=384, batch=1, save=True),
]
# A second held-out grid, written after one constant (the optimizer's temporaries) had been
# refitted on FIT following a look at HELD_OUT's errors: shapes, vocabulary, sequence
# lengths and layouts that neither FIT nor HELD_OUT has, measured only with the constants
# as they stand.
G1 = Shape(448, 6, 1216, 7, 1, 16000)
G2 = Shape(704, 2, 1920, 11, 1, 16000)
G3 = Shape(320, 9, 864, 5, 5, 16000)
HELD_OUT_2 = [
    Case(G1, False, True, 2, seq=192, batch=2, save=True),
    Case(G1, True, False, 4, seq=320, batch=1),
    Case(G2, False, False, 1, seq=320, batch=2),
    Case(G2, True, True, 2, seq=192, batch=2, save=True),
    Case(G3, False, False, 4, seq=192, batch=1, save=True),
    Case(G3, True, True, 1, seq=320, batch=2, save=True),
]
# A third held-out grid, written before the LoRA and logits terms were reworked (on FIT,
# HELD_OUT and HELD_OUT_2, which are all fit data from then on) and measured once before and
# once after: hidden sizes, depths, vocabularies, sequence lengths and micro-batches that no
# other grid has.
K1 = Shape(576, 4, 1536, 9, 3, 20000)
K2 = Shape(832, 3, 2240, 13, 1, 6000)
K3 = Shape(192, 10, 512, 3, 1, 24000)
K4 = Shape(960, 2, 2560, 15, 5, 10000)
HELD_OUT_3 = [
    Case(K1, False, False, 1, seq=224, batch=2),
    Case(K1, True, True, 2, seq=160, batch=3, save=True),
    Case(K1, False, True, 4, seq=288, batch=1, save=True),
    Case(K2, True, False, 1, seq=288, batch=1, save=True),
    Case(K2, False, True, 2, seq=96, batch=5),
    Case(K2, True, True, 4, seq=224, batch=2),
    Case(K3, True, False, 2, seq=448, batch=1),
    Case(K3, False, False, 1, seq=160, batch=2, save=True),
    Case(K3, True, True, 4, seq=96, batch=3, save=True),
    Case(K4, True, True, 1, seq=96, batch=4, save=True),
    Case(K4, False, False, 4, seq=160, batch=1),
]
# A fourth held-out grid, written and measured before the LoRA head/loss term was derived
# (from FIT, HELD_OUT, HELD_OUT_2 and HELD_OUT_3, all fit data from then on) and estimated once
# after: hidden sizes, head widths, depths, vocabularies, sequence lengths and micro-batches
# that no other grid has, with LoRA (the weak spot) in most of them.
P1 = Shape(416, 5, 1120, 13, 1, 14000)
P2 = Shape(672, 4, 1792, 7, 7, 9000)
P3 = Shape(288, 12, 768, 9, 3, 18000)
P4 = Shape(544, 3, 1472, 17, 1, 26000)
HELD_OUT_4 = [
    Case(P1, True, False, 1, seq=352, batch=2),
    Case(P1, True, True, 2, seq=256, batch=3, save=True),
    Case(P1, False, True, 2, seq=128, batch=4),
    Case(P2, True, False, 2, seq=416, batch=1, save=True),
    Case(P2, False, False, 1, seq=192, batch=2, save=True),
    Case(P2, True, True, 1, seq=480, batch=1),
    Case(P3, True, True, 2, seq=128, batch=5),
    Case(P3, False, False, 4, seq=224, batch=1),
    Case(P4, True, False, 1, seq=160, batch=4, save=True),
    Case(P4, True, True, 4, seq=320, batch=1, save=True),
    Case(P4, False, True, 1, seq=64, batch=3),
]
GRIDS = {
    "fit": FIT,
    "held-out": HELD_OUT,
    "held-out-2": HELD_OUT_2,
    "held-out-3": HELD_OUT_3,
    "held-out-4": HELD_OUT_4,
}


def build_model(root: Path, shape: Shape) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    from cli.demo_assets import build_tokenizer, tiny_llama_config

    directory = root / f"llama-{shape.name}"
    if (directory / "config.json").exists():
        return directory
    build_tokenizer(directory, vocab_size=512)
    torch.manual_seed(0)
    config = tiny_llama_config(
        shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=512,
    )
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return directory


def _dataset(path: Path, seq: int) -> dict:
    return {
        "_target_": "tuneyard.datasets.JsonlInstructionDataset",
        "path": str(path),
        "max_seq_length": seq,
    }


def recipe_for(case: Case, model: Path, data: Path, steps: int) -> dict:
    dataset = _dataset(data, case.seq)
    recipe = {
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model),
            "dtype": "float32",
        },
        "distributed": {"strategy": "fsdp2", "activation_checkpointing": case.ac},
        "dataset": dataset,
        "packed_sequence": {"enabled": True, "packed_sequence_size": case.seq},
        "dataloader": {"batch_size": case.batch},
        "step_scheduler": {"max_steps": steps, "grad_accumulation_steps": 1},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "checkpoint": {"enabled": case.save},
        "rng": {"seed": 0},
    }
    if case.save:
        recipe["step_scheduler"] |= {"checkpoint_interval": 2, "val_check_interval": 2}
        recipe["validation_dataset"] = _dataset(data.with_name("val.jsonl"), case.seq)
        recipe["validation_dataloader"] = {"batch_size": case.batch}
    if case.lora:
        recipe["peft"] = {"dim": 8, "match_all_linear": True}
    return recipe


def estimate(recipe: dict, case: Case, device: str) -> dict:
    from jobs.recipe.validation import validate_job

    result = validate_job(recipe, resources={"nproc_per_node": case.ranks, "accelerator": device})
    if not result.valid:
        raise SystemExit(f"{case.name}: invalid recipe: {[e.to_dict() for e in result.errors]}")
    return result.plan["estimate"]["memory_per_rank_bytes"]


def measure(recipe: dict, case: Case, root: Path, device: str) -> dict[str, list[int]]:
    """Every rank's peak at `started` (after the load) and at `finished`, in bytes."""
    import yaml

    from worker.launcher import LaunchSpec, build_env, torchrun_prefix

    path, run_dir = root / f"{case.name}.yaml", root / "runs" / case.name
    path.write_text(yaml.safe_dump(recipe))
    shutil.rmtree(run_dir, ignore_errors=True)  # the logs append: start from none
    spec = LaunchSpec("bench", 1, run_dir, nproc_per_node=case.ranks, accelerator=device)
    env = build_env(spec) | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [*torchrun_prefix(), "--standalone", f"--nproc_per_node={case.ranks}"]
    command += ["-m", "trainer", "--recipe", str(path), "--run-dir", str(run_dir)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{case.name}: trainer failed\n{(proc.stdout + proc.stderr)[-3000:]}")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    peaks = {e["event"]: e["peak_memory_bytes"] for e in events if "peak_memory_bytes" in e}
    return {"started": peaks["started"], "finished": peaks["finished"]}


def run_grid(name: str, cases: list[Case], args: argparse.Namespace, root: Path) -> list[float]:
    """Print one grid's rows; its absolute relative errors."""
    store = root / "measured.json"  # peaks by device, case and steps, for --reuse
    saved = json.loads(store.read_text()) if store.exists() else {}
    data = root / "train.jsonl"
    errors = []
    print(f"\n{name} grid")
    print(f"{'config':<40}{'estimate MiB':>13}{'measured MiB':>13}{'error':>8}   parts MiB")
    for case in cases:
        recipe = recipe_for(case, build_model(root, case.shape), data, args.steps)
        parts = estimate(recipe, case, args.device)
        key = f"{args.device}:{case.name}:{args.steps}"
        peaks = saved.get(key) if args.reuse else None
        if peaks is None:
            peaks = saved[key] = measure(recipe, case, root, args.device)
            store.write_text(json.dumps(saved, indent=1))
        measured = max(peaks["finished"])
        error = (parts["total"] - measured) / measured
        errors.append(abs(error))
        shown = " ".join(f"{k}={v / 2**20:.0f}" for k, v in parts.items() if k != "total")
        print(
            f"{case.name:<40}{parts['total'] / 2**20:>13.1f}{measured / 2**20:>13.1f}"
            f"{error:>+8.1%}   {shown}",
            flush=True,
        )
    print(
        f"{name}: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%} "
        f"over {len(errors)} configs ({args.device})"
    )
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--grid", choices=(*GRIDS, "both", "all"), default="both")
    parser.add_argument("--only", help="comma-separated case names")
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

    write_instruction_jsonl(root / "train.jsonl", 2048)
    write_instruction_jsonl(root / "val.jsonl", 16)  # a short validation pass
    start = time.perf_counter()
    chosen = {"both": ("fit", "held-out"), "all": tuple(GRIDS)}
    names = chosen.get(args.grid, (args.grid,))
    for name in names:
        cases = [c for c in GRIDS[name] if not args.only or c.name in args.only.split(",")]
        if args.device == "cuda":
            import torch

            cases = [c for c in cases if c.ranks <= torch.cuda.device_count()]
        if cases:
            run_grid(name, cases, args, root)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
