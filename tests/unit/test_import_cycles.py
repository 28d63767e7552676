"""No import cycles between tuneyard's modules, counting imports inside functions.

A cycle hidden by an import inside a function still ties two modules together: neither can
be read, tested or moved without the other. The walk resolves every `import` and
`from ... import` (relative ones too) to the deepest tuneyard module it names, builds the
graph of the production packages, and reports each strongly connected component.
Imports under `if TYPE_CHECKING:` are skipped (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "api", "worker", "trainer", "models", "cli", "migrations")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imported(tree: ast.AST, package: str) -> list[str]:
    names: list[str] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if _type_checking(node):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        pending.extend(ast.iter_child_nodes(node))
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the tuneyard modules it imports (a package's `__init__` is not counted
    as imported by its own sub-modules: Python runs it first either way)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for imported in _imported(ast.parse(path.read_text(), str(path)), package):
            target = resolve(imported)
            if target is None or target == name or name.startswith(target + "."):
                continue
            edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles():
    found = cycles(import_graph(module_names(REPO, PACKAGES)))
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loop.py").write_text("from trainer.resume import fingerprint\n")
    (package / "resume.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from trainer import checks\n"
        "def fingerprint():\n    from . import loop\n"
    )
    (package / "checks.py").write_text("import trainer.resume\n")
    graph = import_graph(module_names(tmp_path, ("trainer",)))
    assert graph["trainer.resume"] == {"trainer.loop"}  # the TYPE_CHECKING import skipped
    assert cycles(graph) == [["trainer.loop", "trainer.resume"]]
    (package / "resume.py").write_text("def fingerprint():\n    return 1\n")
    assert cycles(import_graph(module_names(tmp_path, ("trainer",)))) == []
