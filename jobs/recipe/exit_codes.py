"""Trainer exit codes, failure codes and failure records: the contract between trainer and worker.

The trainer ends with one of these exit codes and writes a `failed` event whose `code` is
one of `FAILURE_CODES`. The worker maps them to an outcome: user errors fail the job at
once; infrastructure errors and preemption are retried (each attempt resumes from LATEST).

Only rank 0 writes events, and when one rank fails torchrun stops the others, rank 0
included, so every failing rank also writes a `RankFailure` to
`<run_dir>/failures/rank-<N>.json`. The worker reads those files after the attempt, from a
directory that user-influenced code can write: `RankFailure.from_json` takes any value and
returns a bounded record or None, never raises.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any


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


FAILURES_DIR = "failures"  # <run_dir>/failures/rank-<N>.json, one per failing rank
RECORD_NAME = re.compile(r"rank-(0|[1-9][0-9]{0,6})\.json")
RECORD_BYTES_MAX = 16_384  # a larger file is not a record the trainer wrote
MESSAGE_MAX = 2_000
FIX_MAX = 1_000
# The integer fields of a record and their largest accepted values (all are >= 0).
RECORD_INTS = {"rank": 9_999_999, "exit_code": 255, "step": 2**62, "world_size": 10_000_000}


def failure_record_name(rank: int) -> str:
    return f"rank-{rank}.json"


def clip_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut marked with "..."."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int(value: Any, high: int) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high
    return value if ok else None


def _finite(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


@dataclass(frozen=True)
class RankFailure:
    """How one rank failed, as it saw it: `timestamp` is wall-clock time, comparable
    across the ranks of one machine (and, roughly, of a cluster with synchronized clocks)."""

    rank: int
    exit_code: int  # a key of FAILURE_CODES
    message: str
    fix: str = ""
    step: int = 0
    timestamp: float = 0.0
    world_size: int = 1
    attempt: int | None = None  # TUNEYARD_ATTEMPT of the run that wrote it

    @property
    def code(self) -> str:
        return FAILURE_CODES[ExitCode(self.exit_code)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["message"], data["fix"] = (
            clip_text(self.message, MESSAGE_MAX),
            clip_text(self.fix, FIX_MAX),
        )
        return {**data, "code": self.code}

    @classmethod
    def from_json(cls, data: Any) -> RankFailure | None:
        """The record in `data`, texts clipped; None for anything the trainer does not write."""
        if not isinstance(data, dict):
            return None
        ints = {name: _int(data.get(name), high) for name, high in RECORD_INTS.items()}
        message, fix, attempt = data.get("message"), data.get("fix", ""), data.get("attempt")
        timestamp = _finite(data.get("timestamp"))
        if None in ints.values() or timestamp is None or ints["rank"] >= ints["world_size"]:
            return None
        if ints["exit_code"] not in FAILURE_CODES or not isinstance(message, str):
            return None
        if not isinstance(fix, str) or (attempt is not None and _int(attempt, 2**62) is None):
            return None
        message, fix = clip_text(message, MESSAGE_MAX), clip_text(fix, FIX_MAX)
        return cls(**ints, message=message, fix=fix, timestamp=timestamp, attempt=attempt)
