"""Launching the trainer for tests: recipes, `python -m trainer` / torchrun runs, results.

Runs are real subprocesses (torchrun with 2 gloo ranks where the test needs distribution).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from worker.launcher import CPU_ALLOCATOR_ENV

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Assets:
    root: Path
    model: Path
    train: Path
    val: Path


@dataclass
class RunResult:
    run_dir: Path
    returncode: int
    output: str

    def records(self, kind: str = "train") -> list[dict[str, Any]]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    def events(self) -> list[dict[str, Any]]:
        path = self.run_dir / "events.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def latest(self) -> Path:
        root = self.run_dir / "checkpoints"
        return root / (root / "LATEST").read_text().strip()


def base_recipe(assets: Assets, **sections: Any) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "step_scheduler": {
            "max_steps": 30,
            "num_epochs": 2,
            "grad_accumulation_steps": 2,
            "val_check_interval": 10,
            "checkpoint_interval": 10,
        },
        "rng": {"seed": 7},
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(assets.model),
            "dtype": "float32",
        },
        "distributed": {"strategy": "ddp"},
        "dataset": {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(assets.train),
            "max_seq_length": 64,
        },
        "validation_dataset": {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(assets.val),
        },
        "dataloader": {"batch_size": 4},
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 3.0e-3, "weight_decay": 0.01},
        "lr_scheduler": {
            "_target_": "tuneyard.schedulers.CosineAnnealingWarmup",
            "warmup_steps": 3,
            "min_lr": 1.0e-4,
        },
        "clip_grad_norm": {"max_norm": 1.0},
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(recipe.get(name), dict):
            recipe[name] = {**recipe[name], **value}
        else:
            recipe[name] = value
    return recipe


def trainer_env(assets: Assets) -> dict[str, str]:
    """The worker's CPU environment (its allocator setting included) for a test run."""
    env = {**CPU_ALLOCATOR_ENV, **os.environ}
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TUNEYARD_DATA_ROOTS": str(assets.root),
            "TUNEYARD_CHECKPOINT_ROOTS": str(assets.root),
            "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        }
    )
    return env


def trainer_command(recipe_path: Path, run_dir: Path, nproc: int, overrides=()) -> list[str]:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    return [
        *launcher,
        "-m",
        "trainer",
        "--recipe",
        str(recipe_path),
        "--run-dir",
        str(run_dir),
        *overrides,
    ]


def write_recipe(assets: Assets, name: str, recipe: dict[str, Any]) -> Path:
    path = assets.root / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe))
    return path


def launch(
    assets: Assets,
    name: str,
    recipe: dict[str, Any],
    nproc: int = 1,
    run_dir: Path | None = None,
    overrides=(),
    timeout: float = 240,
) -> RunResult:
    recipe_path = write_recipe(assets, name, recipe)
    run_dir = run_dir or assets.root / "runs" / name
    proc = subprocess.run(
        trainer_command(recipe_path, run_dir, nproc, overrides),
        cwd=REPO,
        env=trainer_env(assets),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return RunResult(run_dir, proc.returncode, proc.stdout + proc.stderr)


def launch_until(
    assets: Assets,
    name: str,
    recipe: dict[str, Any],
    nproc: int,
    run_dir: Path,
    step: int,
    sig: int,
    timeout: float = 240,
) -> RunResult:
    """Start a run, wait until metrics.jsonl has a train record for `step`, send `sig`."""
    recipe_path = write_recipe(assets, name, recipe)
    proc = subprocess.Popen(
        trainer_command(recipe_path, run_dir, nproc),
        cwd=REPO,
        env=trainer_env(assets),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and any(
            json.loads(x).get("step", 0) >= step and json.loads(x)["kind"] == "train"
            for x in metrics.read_text().splitlines()
            if x.strip()
        ):
            break
        time.sleep(0.05)
    if sig == signal.SIGKILL:  # every rank at once, as a node failure would
        import psutil

        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    else:
        proc.send_signal(sig)
    output, _ = proc.communicate(timeout=timeout)
    return RunResult(run_dir, proc.returncode, output)


def transformers_val_loss(model_dir: Path, val_path: Path) -> float:
    """Validation loss of a checkpoint loaded by plain transformers, per label token, computed
    as the trainer computes it: the check that a saved model is the model that trained."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.data.collate import Collator
    from trainer.data.datasets import JsonlInstructionDataset
    from trainer.loss import MaskedCrossEntropy, token_loss_sum

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = JsonlInstructionDataset(tokenizer, str(val_path))
    batch = Collator(tokenizer.pad_token_id)([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = token_loss_sum(MaskedCrossEntropy(), logits, batch["labels"])
    return float(loss) / int((batch["labels"] != -100).sum())


def build_assets(root: Path) -> Assets:
    from cli.demo_assets import build_tiny_llama, write_instruction_jsonl

    # attention dropout makes exact resume depend on restoring every rank's RNG stream
    model = build_tiny_llama(root / "tiny-llama", attention_dropout=0.1)
    train = write_instruction_jsonl(root / "data" / "train.jsonl", 256, seed=0)
    val = write_instruction_jsonl(root / "data" / "val.jsonl", 32, seed=1)
    return Assets(root, model, train, val)


STRATEGIES = {
    "ddp": {"strategy": "ddp"},
    "fsdp2": {"strategy": "fsdp2", "activation_checkpointing": True},
    "tp2": {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True},
}
_shared_runs: dict[str, RunResult] = {}


def strategy_recipe(assets: Assets, name: str) -> dict[str, Any]:
    return base_recipe(assets, distributed=STRATEGIES[name], checkpoint={"keep_last": 2})


def strategy_run(assets: Assets, name: str) -> RunResult:
    """The 30-step, 2-rank run for one strategy, launched once per session."""
    if name not in _shared_runs:
        recipe = strategy_recipe(assets, name)
        _shared_runs[name] = launch(assets, f"parallel-{name}", recipe, nproc=2)
    return _shared_runs[name]


def benchmark_recipe(assets: Assets, warmup: int, measured: int) -> dict[str, Any]:
    """A 2-rank DDP benchmark recipe on mock data (fewer samples than it needs: it cycles)."""
    return {
        "recipe": "BenchmarkingRecipeForNextTokenPrediction",
        "benchmark": {"warmup_steps": warmup, "measured_steps": measured},
        "step_scheduler": {"global_batch_size": 4, "local_batch_size": 2},
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(assets.model),
            "dtype": "float32",
        },
        "distributed": {"strategy": "ddp"},
        "dataset": {
            "_target_": "tuneyard.datasets.MockDataset",
            "vocab_size": 512,
            "seq_length": 32,
            "num_samples": 8,
        },  # fmt: skip
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
    }


def comparison_recipe(assets: Assets, distributed: dict, batch_size: int, max_steps: int) -> dict:
    """A dropout-free run that validates and checkpoints every 4 steps: what a parallel
    layout's run and its one-process reference share."""
    return base_recipe(
        assets,
        distributed=distributed,
        model={"attention_dropout": 0.0},
        dataloader={"batch_size": batch_size},
        step_scheduler={"max_steps": max_steps, "val_check_interval": 4, "checkpoint_interval": 4},
        checkpoint={"keep_last": 2},
    )


def assert_resumed_exactly(run: RunResult, resumed: RunResult, start: int, steps: int) -> None:
    """`resumed` started from `run`'s step-`start` checkpoint: the resume fingerprint passed,
    and steps start+1..steps and the last validation equal the uninterrupted run's exactly."""
    assert resumed.returncode == 0, resumed.output[-3000:]
    events = resumed.events()
    assert any(e["event"] == "resume_verified" and e["step"] == start for e in events), events
    expected = {r["step"]: r for r in run.records("train")}
    got = resumed.records("train")
    assert [r["step"] for r in got] == list(range(start + 1, steps + 1))
    for record in got:
        want = expected[record["step"]]
        assert (record["loss"], record["grad_norm"]) == (want["loss"], want["grad_norm"])
    val_want = [r for r in run.records("val") if r["step"] == steps]
    val_got = [r for r in resumed.records("val") if r["step"] == steps]
    assert val_got[0]["val_loss"] == val_want[0]["val_loss"]
