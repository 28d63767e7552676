"""Two-rank torchrun runs (gloo) of tiny Gemma 2 and Gemma 3 with `tp_size: 2` and SP.

They prove the Gemma rows' tensor-parallel claim end to end with each family's own plan
(sandwich norms sharded on the sequence, Gemma 3's per-head q/k norms on the heads): the
run trains 10 steps to the same losses and weights as a one-process run of the same recipe,
and its consolidated checkpoint (tied, no lm_head tensor), loaded with plain transformers,
reproduces its validation loss. The tiny configs have a sliding window shorter than the
samples and Gemma 2's default soft-caps.
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
    query_pre_attn_scalar=24, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip


def build_tiny(family: str, directory: Path) -> Path:
    import transformers

    from trainer.assets import build_tokenizer

    build_tokenizer(directory, vocab_size=512)
    config_class = {"gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig}
    config = config_class[family](**TINY)
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


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def runs(request: pytest.FixtureRequest, assets: Assets) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    family = request.param
    build_tiny(family, assets.root / f"tiny-{family}")
    tp2 = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": True}
    tp_run = launch(assets, f"tp2-{family}", family_recipe(assets, family, tp2), nproc=2)
    single = family_recipe(assets, family, {"strategy": "fsdp2"})
    return tp_run, launch(assets, f"tp1-{family}", single, nproc=1)


def trained_weights(run: RunResult) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for path in (run.run_dir / "checkpoints" / "step_10" / "model").glob("*.safetensors"):
        weights.update(load_file(path))
    return weights


def test_gemma_tp_run_trains_like_one_process(runs: tuple[RunResult, RunResult]) -> None:
    for run in runs:
        assert run.returncode == 0, run.output[-3000:]
    tp_losses, single_losses = ([r["loss"] for r in run.records("train")] for run in runs)
    assert len(tp_losses) == 10
    assert sum(tp_losses[-3:]) / 3 < 0.8 * sum(tp_losses[:3]) / 3, tp_losses
    assert tp_losses == pytest.approx(single_losses, rel=1e-4)


def test_gemma_tp_weights_equal_the_one_process_weights(runs: tuple[RunResult, RunResult]) -> None:
    tp_weights, single_weights = (trained_weights(run) for run in runs)
    assert tp_weights.keys() == single_weights.keys() and "lm_head.weight" not in tp_weights
    for name, tensor in tp_weights.items():
        torch.testing.assert_close(tensor, single_weights[name], atol=1e-4, rtol=0, msg=name)


def test_gemma_tp_checkpoint_reproduces_the_validation_loss(
    runs: tuple[RunResult, RunResult], assets: Assets
) -> None:
    tp_run = runs[0]
    model_dir = tp_run.run_dir / "checkpoints" / "step_10" / "model"
    val = [r for r in tp_run.records("val") if r["step"] == 10]
    assert val and transformers_val_loss(model_dir, assets.val) == pytest.approx(
        val[0]["val_loss"], rel=1e-4
    )
