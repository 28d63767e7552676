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

import family_runs
import pytest
from trainer_harness import Assets, RunResult, launch

pytestmark = pytest.mark.slow

TINY = {
    **family_runs.TINY_DENSE,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "sliding_window": 8,  # the reversal samples are longer: every layer's window is crossed
}
MOE = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)


@pytest.fixture(scope="module")
def mistral_runs(assets: Assets) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    return family_runs.tiny_tp_runs(assets, "mistral", "MistralConfig", **TINY)


@pytest.fixture(scope="module")
def mixtral_run(assets: Assets) -> RunResult:
    directory = assets.root / "tiny-mixtral"
    model_dir = family_runs.build_tiny(directory, "MixtralConfig", **{**TINY, **MOE})
    recipe = family_runs.family_recipe(assets, model_dir, {"strategy": "fsdp2", "ep_size": 2})
    return launch(assets, "ep2-mixtral", recipe, nproc=2)


def test_mistral_tp_run_trains_like_one_process(mistral_runs, assets: Assets) -> None:
    family_runs.assert_trains_like_one_process(mistral_runs)
    family_runs.assert_weights_equal(mistral_runs)
    family_runs.assert_checkpoint_reproduces_val_loss(mistral_runs[0], assets)


def test_mixtral_ep_run_trains_and_saves_the_full_model(mixtral_run, assets: Assets) -> None:
    family_runs.assert_run_trains(mixtral_run)
    weights = family_runs.trained_weights(mixtral_run)
    experts = {k for k in weights if ".block_sparse_moe.experts." in k}
    assert len(experts) == 2 * 4 * 3 and not any(".mlp." in k for k in weights)
    family_runs.assert_checkpoint_reproduces_val_loss(mixtral_run, assets)
