"""Two-rank torchrun runs (gloo) of tiny Gemma 2 and Gemma 3 with `tp_size: 2` and SP.

They prove the Gemma rows' tensor-parallel claim end to end with each family's own plan
(sandwich norms sharded on the sequence, Gemma 3's per-head q/k norms on the heads): the
run trains 10 steps to the same losses and weights as a one-process run of the same recipe,
and its consolidated checkpoint (tied, no lm_head tensor), loaded with plain transformers,
reproduces its validation loss. The tiny configs have a sliding window shorter than the
samples and Gemma 2's default soft-caps.
"""

from __future__ import annotations

import family_runs
import pytest
from trainer_harness import Assets, RunResult

pytestmark = pytest.mark.slow

TINY = {
    **family_runs.TINY_DENSE,
    "head_dim": 16,
    "query_pre_attn_scalar": 24,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"],
}
CONFIG_CLASSES = {"gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig"}


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def runs(request: pytest.FixtureRequest, assets: Assets) -> tuple[RunResult, RunResult]:
    """(the tp2 run, a one-process run of the same recipe: the same single data rank)."""
    family = request.param
    return family_runs.tiny_tp_runs(assets, family, CONFIG_CLASSES[family], **TINY)


def test_gemma_tp_run_trains_like_one_process(runs: tuple[RunResult, RunResult]) -> None:
    family_runs.assert_trains_like_one_process(runs)


def test_gemma_tp_weights_equal_the_one_process_weights(runs: tuple[RunResult, RunResult]) -> None:
    assert "lm_head.weight" not in family_runs.assert_weights_equal(runs)  # tied


def test_gemma_tp_checkpoint_reproduces_the_validation_loss(
    runs: tuple[RunResult, RunResult], assets: Assets
) -> None:
    family_runs.assert_checkpoint_reproduces_val_loss(runs[0], assets)
