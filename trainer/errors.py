"""The trainer's one exception type: a clear message bound to an exit code.

Anything the user can fix (missing data, a tokenizer that does not fit the model, a
checkpoint of another architecture, a feature this machine cannot run) is raised as a
`TrainerError`; the entry point prints its message, writes this rank's failure record and
(rank 0) a `failed` event with the matching failure code, and exits with `exit_code`, never
with a traceback. `fix`, when given, says what to change; most messages still carry their fix
after a semicolon, which reads the same.
"""

from __future__ import annotations

from jobs.recipe.exit_codes import ExitCode


class TrainerError(Exception):
    def __init__(self, exit_code: ExitCode, message: str, fix: str = ""):
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.fix = fix


def data_error(message: str, fix: str = "") -> TrainerError:
    return TrainerError(ExitCode.DATA_ERROR, message, fix)


def checkpoint_error(message: str, fix: str = "") -> TrainerError:
    return TrainerError(ExitCode.CHECKPOINT_ERROR, message, fix)


def unsupported(message: str, fix: str = "") -> TrainerError:
    return TrainerError(ExitCode.UNSUPPORTED, message, fix)
