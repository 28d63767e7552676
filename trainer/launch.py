"""`python -m trainer.launch <torchrun arguments>`: torchrun, as the worker starts it, where a
stop asked by a signal ends in one line instead of a traceback.

When a pause, a cancel or a preemption sends SIGTERM, torchrun's agent forwards it to the
ranks (which save a checkpoint and exit, `trainer.finetune`) and then raises
`SignalException` out of its own main loop: uncaught, Python prints some thirty lines of
torchrun's frames into the job log, on every pause. Here that exception becomes one line
and the exit code an uncaught exception gives (1), so how the worker classifies the
attempt does not change. Any other exception is torchrun's to report, as before.
"""

from __future__ import annotations

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun_main

SIGNAL_EXIT = 1  # what torchrun exits with when the exception escapes


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def launch(argv: list[str]) -> int:
    """Run torchrun with `argv`; 0 when it returns, SIGNAL_EXIT when a signal stopped it."""
    try:
        torchrun_main(argv)
    except SignalException as exc:
        print(
            f"[tuneyard] torchrun stopped by {signal_name(int(exc.sigval))}: every rank was "
            "asked to stop",
            file=sys.stderr,
            flush=True,
        )
        return SIGNAL_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
