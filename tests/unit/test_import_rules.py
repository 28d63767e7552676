"""The import rules of DESIGN.md, enforced by walking every module's AST.

- `jobs` imports the standard library, pydantic, pydantic_settings, sqlalchemy, yaml and the
  torch-free `models.registry` only; celery, kombu and alembic at most inside functions.
- `api` and `worker` never import `trainer` or `models` (except `models.registry`), nor
  torch, transformers, peft: the API image carries no torch, the worker runs the trainer
  as a subprocess.
- `models` never imports `jobs`, `api`, `worker` or `trainer`.
- `trainer` knows nothing of the database, the broker or HTTP: no `api`, `worker`, DB or
  Celery modules, and of `jobs` only the torch-free contract modules.
- `cli` modules import no torch stack at module level, so `tuneyard validate` stays fast.
Imports under `if TYPE_CHECKING:` are not runtime imports and are skipped.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names)
TORCH_STACK = {"torch", "transformers", "peft", "safetensors", "tokenizers", "torchao"}
JOBS_ALLOWED = {"pydantic", "pydantic_core", "pydantic_settings", "sqlalchemy", "yaml", "jobs"}
JOBS_LAZY_ONLY = {"celery", "kombu", "alembic"}
TRAINER_FORBIDDEN = {
    "api",
    "worker",
    "sqlalchemy",
    "psycopg",
    "celery",
    "kombu",
    "redis",
    "fastapi",
    "alembic",
    "httpx",
}
TRAINER_FORBIDDEN_JOBS = {
    "jobs.store.engine",
    "jobs.store.tables",
    "jobs.store.queries",
    "jobs.store.leases",
    "jobs.store.ingest",
    "jobs.broker",
    "jobs.store.api_keys",
}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # absolute dotted name
    module_level: bool

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        where = "module level" if self.module_level else "in a function"
        return f"{self.path.relative_to(REPO)}:{self.line} imports {self.module} ({where})"


def _package_of(path: Path) -> list[str]:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return parts if path.name == "__init__.py" else parts[:-1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, path: Path, in_function: bool) -> Iterator[Import]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            yield from (i for n in child.orelse for i in _walk_one(n, path, in_function))
            continue
        yield from _walk_one(child, path, in_function)


def _walk_one(node: ast.AST, path: Path, in_function: bool) -> Iterator[Import]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield Import(path, node.lineno, alias.name, not in_function)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = _package_of(path)[: len(_package_of(path)) - node.level + 1]
            base = ".".join([*package, *([node.module] if node.module else [])])
        names = [f"{base}.{a.name}" for a in node.names] if base in {"models", "jobs"} else [base]
        for name in names:
            yield Import(path, node.lineno, name, not in_function)
    else:
        nested = in_function or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
        )
        yield from _walk(node, path, nested)


def imports_of(package: str) -> list[Import]:
    root = REPO / package
    found: list[Import] = []
    for path in sorted(root.rglob("*.py")) if root.is_dir() else []:
        found += _walk(ast.parse(path.read_text(), str(path)), path, in_function=False)
    return found


def _is_registry(module: str) -> bool:
    return module == "models.registry" or module.startswith("models.registry.")


def jobs_violation(imp: Import) -> bool:
    if imp.top in STDLIB or imp.top in JOBS_ALLOWED or _is_registry(imp.module):
        return False
    if imp.module == "models":  # `from models import registry` names the registry module
        return True
    return not (imp.top in JOBS_LAZY_ONLY and not imp.module_level)


def api_worker_violation(imp: Import) -> bool:
    if imp.top in TORCH_STACK or imp.top == "trainer":
        return True
    return imp.top == "models" and not _is_registry(imp.module)


def models_violation(imp: Import) -> bool:
    return imp.top in {"jobs", "api", "worker", "trainer"}


def trainer_violation(imp: Import) -> bool:
    if imp.top in TRAINER_FORBIDDEN:
        return True
    return any(imp.module == m or imp.module.startswith(m + ".") for m in TRAINER_FORBIDDEN_JOBS)


# `cli.main` imports every topic module at start: these stay inside the commands that use them.
CLI_LAZY_ONLY = {"httpx", "rich", "uvicorn", "celery", "fastapi", "api", "worker"}


def cli_violation(imp: Import) -> bool:
    if not imp.module_level:
        return False
    if imp.top in TORCH_STACK or imp.top in CLI_LAZY_ONLY or imp.top == "trainer":
        return True
    return imp.top == "models" and not _is_registry(imp.module)


RULES = [
    ("jobs", jobs_violation),
    ("api", api_worker_violation),
    ("worker", api_worker_violation),
    ("models", models_violation),
    ("trainer", trainer_violation),
    ("cli", cli_violation),
]


@pytest.mark.parametrize(("package", "violates"), RULES, ids=[r[0] for r in RULES])
def test_import_rules(package, violates):
    bad = [str(imp) for imp in imports_of(package) if violates(imp)]
    assert not bad, f"{package} breaks the import rules of DESIGN.md:\n" + "\n".join(bad)


def test_the_walker_sees_lazy_relative_and_type_checking_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    package = tmp_path / "jobs"
    package.mkdir()
    (package / "mod.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "from . import tables\n"
        "if TYPE_CHECKING:\n    import transformers\n"
        "def f():\n    import celery\n"
    )
    found = {(i.module, i.module_level) for i in imports_of("jobs")}
    assert found == {
        ("typing", True),
        ("torch", True),
        ("jobs.store.tables", True),
        ("celery", False),
    }
    assert [i.module for i in imports_of("jobs") if jobs_violation(i)] == ["torch"]


def test_validation_and_the_api_path_load_no_torch():
    """What the API and `tuneyard validate` import at run time pulls in no torch stack."""
    import subprocess

    code = (
        "import sys, cli.main, jobs.recipe.validation, models.registry\n"
        "from jobs.recipe.validation import validate_job\n"
        "validate_job({'model': {}}, ['--a.b', '1'])\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(TORCH_STACK)!r})\n"
        "print(bad)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
