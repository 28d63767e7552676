"""Model-family torchrun runs for the integration tests: the tiny checkpoint, the 10-step
recipe, the tp2 / one-process pair and the checks every family's run makes.

A family test builds its tiny transformers checkpoint with `build_tiny`, launches
`tp_and_one_process_runs` (or one `launch` of `family_recipe`), and asserts with
`assert_trains_like_one_process`, `assert_weights_equal` and
`assert_checkpoint_reproduces_val_loss`: the same checks, with the same tolerances, for
every family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_harness import Assets, RunResult, base_recipe, launch, transformers_val_loss

STEPS = 10
# The dense core of every family's tiny config (the tiny tokenizer's 512 tokens).
TINY_DENSE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
TP2 = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True}
ONE_PROCESS = {"strategy": "fsdp2"}


def build_tiny(directory: Path, config_class: str, **config: Any) -> Path:
    """A seeded transformers checkpoint of `transformers.<config_class>(**config)` with the
    tiny tokenizer beside it."""
    import transformers

    from cli.demo_assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    hf_config = getattr(transformers, config_class)(**config)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(hf_config).save_pretrained(directory)
    return directory


def family_recipe(assets: Assets, model_dir: Path, distributed: dict) -> dict:
    """The base recipe for `model_dir`: 10 steps, no gradient accumulation."""
    recipe = base_recipe(
        assets,
        distributed=distributed,
        step_scheduler={"max_steps": STEPS, "grad_accumulation_steps": 1},
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(model_dir)
    return recipe


def tp_and_one_process_runs(
    assets: Assets, name: str, model_dir: Path
) -> tuple[RunResult, RunResult]:
    """(the tp2 + SP run, a one-process run of the same recipe: the same single data rank)."""
    tp_run = launch(assets, f"tp2-{name}", family_recipe(assets, model_dir, TP2), nproc=2)
    single = family_recipe(assets, model_dir, ONE_PROCESS)
    return tp_run, launch(assets, f"tp1-{name}", single, nproc=1)


def tiny_tp_runs(
    assets: Assets, family: str, config_class: str, **config: Any
) -> tuple[RunResult, RunResult]:
    """`build_tiny` under assets.root/tiny-<family>, then `tp_and_one_process_runs` of it."""
    model_dir = build_tiny(assets.root / f"tiny-{family}", config_class, **config)
    return tp_and_one_process_runs(assets, family, model_dir)


def final_checkpoint(run: RunResult) -> Path:
    return run.run_dir / "checkpoints" / f"step_{STEPS}" / "model"


def trained_weights(run: RunResult) -> dict[str, torch.Tensor]:
    """Every tensor of the run's consolidated step-10 checkpoint."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in final_checkpoint(run).glob("*.safetensors"):
        weights.update(load_file(path))
    return weights


def assert_run_trains(run: RunResult) -> list[float]:
    """The run exits 0 and its 10 losses fall (last three under 0.8 of the first three)."""
    assert run.returncode == 0, run.output[-3000:]
    losses = [r["loss"] for r in run.records("train")]
    assert len(losses) == STEPS
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    return losses


def assert_trains_like_one_process(runs: tuple[RunResult, RunResult]) -> None:
    """Both runs exit 0, the tp run's loss falls and equals the one-process run's per step."""
    tp_run, single = runs
    assert single.returncode == 0, single.output[-3000:]
    tp_losses = assert_run_trains(tp_run)
    assert tp_losses == pytest.approx([r["loss"] for r in single.records("train")], rel=1e-4)


def assert_weights_equal(runs: tuple[RunResult, RunResult]) -> dict[str, torch.Tensor]:
    """The two runs' trained weights agree tensor by tensor; returns the tp run's."""
    tp_weights, single_weights = (trained_weights(run) for run in runs)
    assert tp_weights.keys() == single_weights.keys()
    for name, tensor in tp_weights.items():
        torch.testing.assert_close(tensor, single_weights[name], atol=1e-4, rtol=0, msg=name)
    return tp_weights


def assert_checkpoint_reproduces_val_loss(run: RunResult, assets: Assets) -> None:
    """Plain transformers, loading the step-10 checkpoint, gives the run's validation loss."""
    val = [r for r in run.records("val") if r["step"] == STEPS]
    assert val and transformers_val_loss(final_checkpoint(run), assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )
