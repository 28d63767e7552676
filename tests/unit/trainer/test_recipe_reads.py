"""The trainer reads the typed recipe, never recipe data as a dict with a default of its own.

`jobs.recipe` computes every default once; a `.get(key, default)` on recipe data inside
`trainer/` would be a second default that can disagree with it. An AST walk finds every
`.get(...)` call in `trainer/` whose receiver is recipe data: anything reached from a
`recipe` (`recipe.model.get`, `run.recipe...`), a `TargetCall`'s `kwargs`, the topology's
`options`, or a `distributed`/`layout`/`topology` section. Dataset rows, checkpoint state
and the environment are not recipe data and may be read with `.get`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[3] / "trainer"
RECIPE_DATA = re.compile(
    r"\b(recipe|distributed|layout|topology|compile_section)\b|\.(options|kwargs)\b"
)


def recipe_gets(source: str) -> list[str]:
    """`receiver.get(...)` texts in `source` whose receiver is recipe data."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            receiver = ast.unparse(node.func.value)
            if RECIPE_DATA.search(receiver):
                found.append(f"{receiver}.get(...) at line {node.lineno}")
    return found


def test_the_trainer_reads_no_recipe_data_with_get() -> None:
    offenders = {
        str(path.relative_to(TRAINER.parent)): found
        for path in sorted(TRAINER.rglob("*.py"))
        if (found := recipe_gets(path.read_text()))
    }
    assert offenders == {}, "read the typed field instead (jobs.recipe.typed computes defaults)"


@pytest.mark.parametrize(
    "source",
    [
        'strategy = distributed.get("strategy", "fsdp2")',
        'name = recipe.model.get("pretrained_model_name_or_path")',
        'backend = run.recipe.compile_section.get("backend", "inductor")',
        'mp = recipe.topology.options.get("mp_policy")',
        'lr = call.kwargs.get("lr", 1e-3)',
        'shape = layout.get("mesh_shape")',
    ],
)
def test_the_walk_finds_recipe_data_read_with_get(source: str) -> None:
    assert recipe_gets(source), source


@pytest.mark.parametrize(
    "source",
    [
        'rank = int(os.environ.get("RANK", "0"))',
        'text = row.get("text", "")',
        'rng = state.get("rng") or []',
        "peak = peaks.get(dtype)",
    ],
)
def test_the_walk_leaves_rows_state_and_the_environment_alone(source: str) -> None:
    assert recipe_gets(source) == [], source
