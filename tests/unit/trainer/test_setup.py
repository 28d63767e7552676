"""Run setup: PEFT with tensor or expert parallelism is refused, the data position rescales with dp."""

from __future__ import annotations

import pytest

from jobs.recipe.exit_codes import ExitCode
from trainer.errors import TrainerError


def test_peft_with_tensor_parallel_is_refused() -> None:
    from trainer.setup import check_peft_parallelism

    with pytest.raises(TrainerError) as info:
        check_peft_parallelism({"peft": {"dim": 8}, "distributed": {"tp_size": 2}})
    assert info.value.exit_code == ExitCode.UNSUPPORTED and "tp_size" in info.value.message
    check_peft_parallelism({"peft": {"dim": 8}, "distributed": {"tp_size": 1}})
    with pytest.raises(TrainerError) as info:
        check_peft_parallelism({"peft": {"dim": 8}, "distributed": {"ep_size": 2}})
    assert info.value.exit_code == ExitCode.UNSUPPORTED and "ep_size" in info.value.message
    check_peft_parallelism({"distributed": {"ep_size": 2}})


def test_data_position_is_rescaled_when_dp_size_changes() -> None:
    from trainer.setup import _data_position

    state = {"data": {"epoch": 1, "batches_done": 6}, "dp_size": 2}
    assert _data_position(state, 2) == {"epoch": 1, "batches_done": 6}
    assert _data_position(state, 4) == {"epoch": 1, "batches_done": 3}
