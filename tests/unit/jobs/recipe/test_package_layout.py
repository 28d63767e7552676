"""`jobs/recipe` is laid out by concern: a few modules at the top, the rest in sub-packages
that each say in their docstring what they own."""

from __future__ import annotations

import ast
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[4] / "jobs" / "recipe"
TOP_LEVEL = {
    "validation.py",
    "typed.py",
    "errors.py",
    "settings.py",
    "exit_codes.py",
    "metrics_sample.py",
}


def test_at_most_six_modules_at_the_top():
    modules = {p.name for p in RECIPE.glob("*.py")} - {"__init__.py"}
    assert modules <= TOP_LEVEL and len(modules) <= 6, sorted(modules)


def test_every_sub_package_says_what_it_owns():
    packages = [p for p in RECIPE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert {p.name for p in packages} >= {
        "load",
        "automodel",
        "targets",
        "topology",
        "model",
        "paths",
        "plan",
    }
    for package in packages:
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
        assert docstring and len(docstring.split()) >= 12, package.name
