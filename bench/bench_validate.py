"""Benchmark: `validate_job` on the submit benchmark's recipe, in one process.

The CPU a submit spends validating, timed without the server around it: the same recipe
`bench_api_submit.py` posts (a tiny Llama config.json and a SQuAD directory under a data
root), validated as the CLI does (the caller's dict copied), as the API does the first
time (the request body handed over), and as the API answers it again
(`api.validation_memo.validate_cached`: the memo's key and its filesystem replay). Prints
the median and best of `--rounds` rounds of `--calls` calls each, and the ratios to the
copied run. Run: `python bench/bench_validate.py [--calls 1000] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def rounds(
    recipe: dict,
    settings: object,
    handed_over: bool,
    calls: int,
    count: int,
    memo: bool = False,
) -> list[float]:
    from api.validation_memo import validate_cached
    from jobs.recipe.scope import JobScope
    from jobs.recipe.validation import validate_job

    validate = validate_cached if memo else validate_job
    scope = JobScope(project="bench", owns_job=lambda _job: False)
    times = []
    for _ in range(count):
        bodies = [copy.deepcopy(recipe) for _ in range(calls)]  # outside the clock
        start = time.perf_counter()
        for body in bodies:
            result = validate(body, (), None, settings, scope=scope, handed_over=handed_over)
        times.append((time.perf_counter() - start) / calls * 1000)
        assert result.valid, result.errors
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from bench_api_submit import write_assets

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TUNEYARD_DATA_ROOTS"] = tmp
        os.environ["TUNEYARD_HOME"] = str(Path(tmp) / "home")
        from jobs.recipe.settings import RecipeSettings

        recipe, settings = write_assets(Path(tmp)), RecipeSettings()
        rounds(recipe, settings, False, 100, 1)  # warm: imports, caches
        copied = rounds(recipe, settings, False, args.calls, args.rounds)
        handed = rounds(recipe, settings, True, args.calls, args.rounds)
        again = rounds(recipe, settings, True, args.calls, args.rounds, memo=True)
    print(f"validate_job, {args.rounds} rounds of {args.calls} calls, one thread")
    for label, times in (
        ("copied (CLI)", copied),
        ("handed over (API)", handed),
        ("again (API memo)", again),
    ):
        print(f"  {label:<18} median {statistics.median(times):.3f} ms   best {min(times):.3f} ms")
    base = statistics.median(copied)
    print(
        f"  handed over / copied: {statistics.median(handed) / base:.2f}x   "
        f"memo / copied: {statistics.median(again) / base:.2f}x"
    )


if __name__ == "__main__":
    main()
