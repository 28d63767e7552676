"""Start-up: from the `torchrun` launch to the first finished optimizer step, tuneyard's
trainer vs a Hugging Face `Trainer` + peft script, on SmolLM2-135M with LoRA and the same data.

The tuneyard recipe is validated in this process and written as the worker writes it
(`recipe.json`); then both run under `torchrun --standalone --nproc_per_node 1` on the CPU,
alternating for `--rounds` rounds. The trainer's time is the `timestamp` of its first train
record in metrics.jsonl; the baseline's is written by a callback at the end of its step 1.
Prints each round and the medians: `tuneyard - hf` in seconds (the target is <= 2 s).

    python3 bench/bench_startup.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HF_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling,
                              Trainer, TrainerCallback, TrainingArguments)

    model_dir, data, out, marker = sys.argv[1:5]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    rows = [json.loads(line) for line in open(data)]
    def encode(row):  # padded per batch by the collator, as tuneyard's collator does
        return tokenizer(row["prompt"] + row["completion"], truncation=True, max_length=64)
    dataset = [encode(r) for r in rows]
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=32, target_modules="all-linear"))

    class FirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                open(marker, "w").write(str(time.time()))

    args = TrainingArguments(out, max_steps=2, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_steps=1, learning_rate=1e-4,
                             dataloader_num_workers=0, use_cpu=True)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
            callbacks=[FirstStep()]).train()
    """
)


def torchrun(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        *args,
    ]


def wait_for(proc: subprocess.Popen, ready, timeout: float = 600.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = ready()
        if value is not None:
            return value
        if proc.poll() is not None and ready() is None:
            raise RuntimeError(f"run exited with {proc.returncode} before its first step")
        time.sleep(0.05)
    raise TimeoutError("no first step")


def first_train_timestamp(run_dir: Path) -> float | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "train":
            return float(record["timestamp"])
    return None


def run_tuneyard(work: Path, model: Path, data: Path, env: dict[str, str]) -> float:
    recipe = {
        "step_scheduler": {"max_steps": 2, "global_batch_size": 4, "local_batch_size": 4},
        "model": {
            "_target_": "tuneyard.models.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(model),
            "dtype": "float32",
        },
        "peft": {"match_all_linear": True, "dim": 8, "alpha": 32},
        "dataset": {
            "_target_": "tuneyard.datasets.JsonlInstructionDataset",
            "path": str(data),
            "tokenizer_name_or_path": str(model),
            "max_seq_length": 64,
        },
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
        "checkpoint": {"enabled": False},
        "distributed": {"strategy": "ddp"},
    }
    from jobs.recipe.settings import RecipeSettings
    from jobs.recipe.validation import validate_job
    from worker.launcher import write_recipe

    # As the service runs it: validated at submit, stored, written as recipe.json by the worker.
    roots = RecipeSettings(data_roots=env["TUNEYARD_DATA_ROOTS"], checkpoint_roots=str(work))
    result = validate_job(recipe, settings=roots)
    assert result.valid, result.errors
    run_dir = Path(tempfile.mkdtemp(dir=work))
    path = write_recipe(run_dir, result.recipe)
    started = time.time()
    cmd = torchrun("-m", "trainer", "--recipe", str(path), "--run-dir", str(run_dir))
    with subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL) as proc:
        first = wait_for(proc, lambda: first_train_timestamp(run_dir))
        proc.wait()
    return first - started


def run_hf(work: Path, model: Path, data: Path, env: dict[str, str]) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    script, marker = out / "hf_lora.py", out / "first_step"
    script.write_text(HF_SCRIPT)
    started = time.time()
    cmd = torchrun(str(script), str(model), str(data), str(out / "out"), str(marker))
    with subprocess.Popen(cmd, env=env, cwd=out, stdout=subprocess.DEVNULL) as proc:
        first = wait_for(proc, lambda: float(marker.read_text()) if marker.exists() else None)
        proc.wait()
    return first - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from cli.demo_assets import write_instruction_jsonl
    from models.smollm2 import ensure_smollm2_checkpoint

    model = ensure_smollm2_checkpoint()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = write_instruction_jsonl(work / "train.jsonl", n=64, seed=0)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(os.cpu_count() or 1),
            "TUNEYARD_DATA_ROOTS": f"{model.parent}{os.pathsep}{work}",
            "TUNEYARD_CHECKPOINT_ROOTS": str(work),
            "HF_HUB_OFFLINE": "1",
        }
        ours, theirs = [], []
        for round_ in range(args.rounds):
            ours.append(run_tuneyard(work, model, data, env))
            theirs.append(run_hf(work, model, data, env))
            print(
                f"round {round_ + 1}: tuneyard {ours[-1]:.2f} s, hf Trainer+peft {theirs[-1]:.2f} s"
            )
    a, b = statistics.median(ours), statistics.median(theirs)
    print(
        f"median launch->first step: tuneyard {a:.2f} s, hf {b:.2f} s, "
        f"difference {a - b:+.2f} s (target <= +2.00 s), ratio {a / b:.2f}"
    )


if __name__ == "__main__":
    main()
