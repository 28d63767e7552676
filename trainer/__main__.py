"""Entry point: `[torchrun --nproc_per_node N] python -m trainer --recipe R --run-dir D [overrides]`.

A recipe the service stored (`recipe.json`, written by the worker: the typed recipe
validation built) is rebuilt as is with `Recipe.from_json`: nothing is validated or
re-derived, and the schema's code is never imported. A recipe written by hand (or given
overrides) is validated with the same code as `tuneyard validate` (invalid: errors printed,
exit 2 before any model is built). Then the trainer joins the process group, sets the run
up and trains.
Every ending maps to an exit code of `jobs.recipe.exit_codes` and, on rank 0, to a `failed` or
`finished`/`preempted` event in `D/events.jsonl`; user errors print one clear line. Every rank
that fails first writes its own failure record (`trainer.failure_record`): torchrun stops the
other ranks when one fails, and rank 0 may not live to write its event.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.recipe.exit_codes import FAILURE_CODES, ExitCode

if TYPE_CHECKING:
    from jobs.recipe.typed import Recipe


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m trainer")
    parser.add_argument("--recipe", required=True, type=Path, help="recipe YAML")
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory")
    return parser.parse_known_args(argv)


def load_recipe(recipe_path: Path, overrides: list[str], run_dir: Path) -> Recipe | None:
    """The typed recipe to run, or None (errors printed and recorded) when it is invalid."""
    from jobs.recipe.typed import Recipe, StoredRecipeInvalid, is_stored_recipe

    data = _read_stored(recipe_path)
    if is_stored_recipe(data) and not overrides:
        try:
            return Recipe.from_json(data)
        except StoredRecipeInvalid as exc:
            return _invalid(recipe_path, run_dir, [str(exc)])
    from jobs.recipe.validation import validate_job
    from trainer.distributed import resources_from_env

    result = validate_job(recipe_path, overrides, resources_from_env())
    if result.valid and result.typed is not None:
        return result.typed
    return _invalid(recipe_path, run_dir, [str(e) for e in result.errors])


def _read_stored(recipe_path: Path) -> object:
    """The JSON the worker wrote; anything else (YAML by hand) is left to validation."""
    if recipe_path.suffix != ".json":
        return None
    try:
        return json.loads(recipe_path.read_text())
    except (OSError, ValueError):
        return None


def _invalid(recipe_path: Path, run_dir: Path, errors: list[str]) -> None:
    from trainer.metrics import RunLog

    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    log = RunLog(run_dir, is_rank0=is_rank0)
    record_failure(log, 0, ExitCode.INVALID_RECIPE, "; ".join(errors))
    if is_rank0:  # every rank read the same recipe: one copy of the errors is enough
        print(f"recipe {recipe_path} is invalid:", file=sys.stderr)
        for error in errors:
            print(f"  {error}", file=sys.stderr)
    return None


def record_failure(log, step: int, code: ExitCode, message: str, fix: str = "") -> None:
    """This rank's failure record, then (rank 0) the `failed` event the worker reads; torchrun
    itself exits 1 on any rank's failure. A SIGTERM from torchrun waits until both are written."""
    from trainer.failure_record import rank_failure, sigterm_deferred, write_failure_record

    with sigterm_deferred():
        write_failure_record(log.run_dir, rank_failure(code, message, fix, step))
        fields = {"fix": fix} if fix else {}
        log.event(
            "failed", step, code=FAILURE_CODES[code], exit_code=int(code), message=message, **fields
        )
    log.close()  # the trackers' finish may wait on a network: not held against SIGTERM


def loop_for(recipe: Recipe):
    """The loop that runs `recipe.recipe`: benchmark, else fine-tuning."""
    if recipe.recipe == "llm_benchmark":
        from trainer.benchmark import run_benchmark

        return run_benchmark
    from trainer.finetune import train

    return train


def run(recipe: Recipe, run_dir: Path) -> int:
    import torch

    from trainer import distributed
    from trainer.errors import TrainerError
    from trainer.metrics import RunLog
    from trainer.setup import setup_run

    minutes = recipe.dist_env.timeout_minutes or 10
    env = distributed.init_distributed(timeout_s=int(minutes) * 60)
    log = RunLog(run_dir, env.is_rank0)
    training = None
    try:
        training = setup_run(recipe, run_dir, env)
        if recipe.recipe == "llm_kd":  # fine-tuning's loop, with the teacher's step loss
            from trainer.kd import attach_teacher

            attach_teacher(training)
        from trainer.builders import report_kernel_fallbacks

        report_kernel_fallbacks(training.model, log, training.step)
        code = loop_for(recipe)(training, log)
        log.close()
        return int(code)
    except TrainerError as exc:
        code, message, fix, crash = exc.exit_code, exc.message, exc.fix, None
    except torch.OutOfMemoryError as exc:
        code, message = ExitCode.OUT_OF_MEMORY, f"out of memory: {str(exc)[:300]}"
        fix, crash = "", None
    except Exception as exc:  # noqa: BLE001 - a crash: keep the traceback, exit CRASH
        code, message, fix, crash = ExitCode.CRASH, f"{type(exc).__name__}: {exc}", "", exc
    # the record before anything else: torchrun may stop this rank at any moment now
    record_failure(log, training.step if training is not None else 0, code, message, fix)
    if crash is not None:
        traceback.print_exception(crash)
    # every failing rank says so in the log: the rank that saw the cause may not be rank 0
    suffix = f" (fix: {fix})" if fix else ""
    print(f"[rank {env.rank}] error: {message}{suffix}", file=sys.stderr, flush=True)
    return int(code)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(args.recipe, overrides, args.run_dir)
    if recipe is None:
        return int(ExitCode.INVALID_RECIPE)
    try:
        return run(recipe, args.run_dir.resolve())
    finally:
        from trainer.distributed import shutdown

        shutdown()


if __name__ == "__main__":
    exit_code = main()
    # The run is over and its files are closed. Run the Python exit handlers, then skip the
    # interpreter's teardown: destroying gloo's objects there can abort it ("terminate
    # called without an active exception", SIGABRT) after a run that finished, which
    # would turn a success into a crash.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
