"""Two-rank torchrun runs (gloo) of tiny native Mistral (`tp_size: 2`) and Mixtral (`ep_size: 2`).

They prove the two rows' parallel claims end to end through the recipe. Mistral, with a
sliding window shorter than the training samples: the tp2 run with sequence parallelism
trains 10 steps to the losses and weights of a one-process run of the same recipe, and its
consolidated checkpoint, loaded with plain transformers, reproduces its validation loss.
Mixtral, each rank holding half of every layer's experts: the run's loss falls and its
consolidated checkpoint is the full model in Mixtral's own checkpoint names
(`block_sparse_moe.experts.{e}.w1/w2/w3`), which transformers loads to the trainer's
validation loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import Assets, RunResult, base_recipe, launch, transformers_val_loss

pytestmark = pytest.mark.slow

TINY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    sliding_window=8,  # the reversal samples are longer: every layer's window is crossed
)  # fmt: skip
MOE = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)


def build_tiny(family: str, directory: Path) -> Path:
    import transformers

    from trainer.assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    if family == "mistral":
        config = transformers.MistralConfig(**TINY)
    else:
        config = transformers.MixtralConfig(**{**TINY, **MOE})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def family_recipe(assets: Assets, family: str, distributed: dict) -> dict:
    recipe = base_recipe(
        assets,
        distributed=distributed,
        step_scheduler={"max_steps": 10, "grad_accumulation_steps": 1},
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(assets.root / f"tiny-{family}")
    return recipe


def step_10(run: RunResult) -> Path:
    return run.run_dir / "checkpoints" / "step_10" / "model"


def trained_weights(run: RunResult) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in step_10(run).glob("*.safetensors"):
        weights.update(load_file(path))
    return weights


def assert_checkpoint_reproduces_val_loss(run: RunResult, assets: Assets) -> None:
    val = [r for r in run.records("val") if r["step"] == 10]
    assert val and transformers_val_loss(step_10(run), assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )


@pytest.fixture(scope="module")
def mistral_runs(assets: Assets) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    build_tiny("mistral", assets.root / "tiny-mistral")
    tp2 = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True}
    tp_run = launch(assets, "tp2-mistral", family_recipe(assets, "mistral", tp2), nproc=2)
    single = family_recipe(assets, "mistral", {"strategy": "fsdp2"})
    return tp_run, launch(assets, "tp1-mistral", single, nproc=1)


@pytest.fixture(scope="module")
def mixtral_run(assets: Assets) -> RunResult:
    build_tiny("mixtral", assets.root / "tiny-mixtral")
    ep2 = {"strategy": "fsdp2", "ep_size": 2}
    return launch(assets, "ep2-mixtral", family_recipe(assets, "mixtral", ep2), nproc=2)


def test_mistral_tp_run_trains_like_one_process(mistral_runs, assets: Assets) -> None:
    for run in mistral_runs:
        assert run.returncode == 0, run.output[-3000:]
    tp_losses, single_losses = ([r["loss"] for r in run.records("train")] for run in mistral_runs)
    assert len(tp_losses) == 10
    assert sum(tp_losses[-3:]) / 3 < 0.8 * sum(tp_losses[:3]) / 3, tp_losses
    assert tp_losses == pytest.approx(single_losses, rel=1e-4)
    tp_weights, single_weights = (trained_weights(run) for run in mistral_runs)
    assert tp_weights.keys() == single_weights.keys()
    for name, tensor in tp_weights.items():
        torch.testing.assert_close(tensor, single_weights[name], atol=1e-4, rtol=0, msg=name)
    assert_checkpoint_reproduces_val_loss(mistral_runs[0], assets)


def test_mixtral_ep_run_trains_and_saves_the_full_model(mixtral_run, assets: Assets) -> None:
    assert mixtral_run.returncode == 0, mixtral_run.output[-3000:]
    losses = [r["loss"] for r in mixtral_run.records("train")]
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    weights = trained_weights(mixtral_run)
    experts = {k for k in weights if ".block_sparse_moe.experts." in k}
    assert len(experts) == 2 * 4 * 3 and not any(".mlp." in k for k in weights)
    assert_checkpoint_reproduces_val_loss(mixtral_run, assets)
