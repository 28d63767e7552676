"""The real trainer (`-m trainer`) with a data error raised on one chosen rank only.

A data file that every rank reads fails on every rank; the failure this module stands in for
is one only some ranks see (a corrupt shard, a row only their sampler reaches). With
`TUNEYARD_TEST_FAULT_RANK=R` and `TUNEYARD_TEST_FAULT_STEP=S` (default 2), rank R raises
`data_error` when it starts step S, while its peers wait in that step's collectives (they
crash on the closed connection). With S=0 it raises it at set-up while its peers are still
busy loading (a sleep, no collective pending), so torchrun's SIGTERM ends them before they
can write anything. Every other line of the run is the real trainer's: its entry point, its
failure path, its exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

FAULT_RANK_ENV = "TUNEYARD_TEST_FAULT_RANK"
FAULT_STEP_ENV = "TUNEYARD_TEST_FAULT_STEP"
FAULT_MESSAGE = "shard-00003.jsonl:17: not valid JSON (Expecting value)"
FAULT_FIX = "repair or drop line 17 of shard-00003.jsonl"
SLOW_SETUP_S = 120.0  # far longer than torchrun takes to stop the survivors


def _arm_fault() -> None:
    """Make the chosen rank fail at its step (or set-up); at set-up, slow the others down."""
    from trainer import finetune, setup
    from trainer.errors import data_error

    faulty = os.environ.get(FAULT_RANK_ENV) == os.environ.get("RANK", "0")
    at_step = int(os.environ.get(FAULT_STEP_ENV, "2"))
    real_setup, real_step = setup.setup_run, finetune.train_step

    def setup_run(*args, **kwargs):
        if faulty:
            raise data_error(FAULT_MESSAGE, fix=FAULT_FIX)
        time.sleep(SLOW_SETUP_S)
        return real_setup(*args, **kwargs)

    def train_step(run, micro_batches):
        if run.step + 1 >= at_step:
            raise data_error(FAULT_MESSAGE, fix=FAULT_FIX)
        return real_step(run, micro_batches)

    if at_step == 0:
        setup.setup_run = setup_run  # `trainer.__main__.run` imports it when it runs
    elif faulty:
        finetune.train_step = train_step


if __name__ == "__main__":
    from trainer.__main__ import main

    if os.environ.get(FAULT_RANK_ENV) is not None:
        _arm_fault()
    exit_code = main()
    atexit._run_exitfuncs()  # the same ending as `python -m trainer`
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
