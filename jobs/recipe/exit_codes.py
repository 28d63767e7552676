"""Trainer exit codes and failure codes: the contract between trainer and worker.

The trainer ends with one of these exit codes and writes a `failed` event whose `code` is
one of `FAILURE_CODES`. The worker maps them to an outcome: user errors fail the job at
once; infrastructure errors and preemption are retried (each attempt resumes from LATEST).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    CRASH = 1  # an unexpected exception: a bug or an infrastructure fault; retried
    INVALID_RECIPE = 2  # validation failed before any rank built a model
    DATA_ERROR = 3  # missing or unreadable data, tokenizer/model vocab mismatch
    NAN_LOSS = 4  # loss became NaN or inf; the event names the step
    OUT_OF_MEMORY = 5
    CHECKPOINT_ERROR = 6  # checkpoint of another architecture, unreadable checkpoint
    UNSUPPORTED = 7  # a feature this machine cannot run (fp8 on CPU, nccl without CUDA)
    PREEMPTED = 75  # SIGTERM: finished the step, saved a checkpoint, exited (EX_TEMPFAIL)


USER_ERRORS = frozenset(
    {
        ExitCode.INVALID_RECIPE,
        ExitCode.DATA_ERROR,
        ExitCode.NAN_LOSS,
        ExitCode.OUT_OF_MEMORY,
        ExitCode.CHECKPOINT_ERROR,
        ExitCode.UNSUPPORTED,
    }
)

FAILURE_CODES = {
    ExitCode.CRASH: "crash",
    ExitCode.INVALID_RECIPE: "invalid_recipe",
    ExitCode.DATA_ERROR: "data_error",
    ExitCode.NAN_LOSS: "nan_loss",
    ExitCode.OUT_OF_MEMORY: "out_of_memory",
    ExitCode.CHECKPOINT_ERROR: "checkpoint_error",
    ExitCode.UNSUPPORTED: "unsupported",
    ExitCode.PREEMPTED: "preempted",
}


def is_user_error(code: int) -> bool:
    """True when retrying cannot help: the recipe, the data or the model is at fault."""
    try:
        return ExitCode(code) in USER_ERRORS
    except ValueError:
        return False
