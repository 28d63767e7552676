"""Process-group setup: the launch must be the one the recipe was validated for."""

from __future__ import annotations

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from trainer.distributed import DistEnv, check_launch
from trainer.errors import TrainerError


def test_a_launch_unlike_the_validated_layout_is_refused(one_rank_layout) -> None:
    cpu = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    check_launch(cpu, one_rank_layout())
    for layout in (one_rank_layout(world_size=2), one_rank_layout(accelerator="cuda")):
        with pytest.raises(TrainerError) as info:
            check_launch(cpu, layout)
        assert info.value.exit_code == ExitCode.CRASH and "validated for" in info.value.message


def test_the_mesh_reports_its_shape(single_rank_group, one_rank_layout) -> None:
    from trainer.distributed import build_mesh

    topology = build_mesh(single_rank_group, one_rank_layout())
    assert topology.mesh_shape() == {"dp_shard": 1, "tp": 1} and topology.dp_size == 1
