"""Two-rank torchrun runs (gloo) of tiny Qwen2 and Qwen3 with `tp_size: 2` and sequence parallel.

The Llama tp2 run lives in test_parallel_runs.py; these prove the other dense rows' tensor-
parallel claim end to end with each family's own plan (Qwen2's q/k/v bias, Qwen3's per-head
q/k norms): the run trains 10 steps to the same losses and the same weights as a one-process
run of the same recipe (so every gradient, the q/k norms' included, is reduced over the tp
ranks), and its consolidated checkpoint, loaded with plain transformers, reproduces its
validation loss.
"""

from __future__ import annotations

import family_runs
import pytest
from trainer_harness import Assets, RunResult

pytestmark = pytest.mark.slow

FAMILIES = {"qwen2": {"tie_word_embeddings": True}, "qwen3": {"head_dim": 32}}
CONFIG_CLASSES = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def runs(request: pytest.FixtureRequest, assets: Assets) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    family = request.param
    config = {**family_runs.TINY_DENSE, **FAMILIES[family]}
    return family_runs.tiny_tp_runs(assets, family, CONFIG_CLASSES[family], **config)


def test_tp_run_trains_like_one_process(runs: tuple[RunResult, RunResult]) -> None:
    family_runs.assert_trains_like_one_process(runs)


def test_tp_weights_equal_the_one_process_weights(runs: tuple[RunResult, RunResult]) -> None:
    """A gradient left partial over the tp ranks (e.g. a q/k norm's) barely moves the loss in
    10 steps but moves its weights by ~lr per step; the trained weights must agree."""
    family_runs.assert_weights_equal(runs)


def test_tp_checkpoint_reproduces_the_validation_loss(
    runs: tuple[RunResult, RunResult], assets: Assets
) -> None:
    family_runs.assert_checkpoint_reproduces_val_loss(runs[0], assets)
