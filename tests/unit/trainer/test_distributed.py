"""Process-group setup: a backend this machine cannot run is refused."""

from __future__ import annotations

import pytest
import torch

from jobs.recipe.exit_codes import ExitCode
from trainer.errors import TrainerError


def test_a_backend_the_machine_cannot_run_is_refused() -> None:
    from trainer.distributed import DistEnv, check_backend

    cpu = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    check_backend(cpu, {"backend": "gloo"})
    check_backend(cpu, None)
    with pytest.raises(TrainerError) as info:
        check_backend(cpu, {"backend": "nccl"})
    assert info.value.exit_code == ExitCode.UNSUPPORTED and "gloo" in info.value.message
