"""Operator-added `_target_` callables: the `tuneyard.targets` entry-point group.

An operator installs a package whose entry point in the group `tuneyard.targets` names a
`TargetSpec` or a list of them (`my_ops = my_ops.tuneyard:SPECS`); each joins the allowlist
at import. A recipe can never add one. The module the entry point names is imported by the
API too, so it must stay torch-free: the spec's `import_path` (imported only when the
trainer builds it) is where the torch code lives. A spec that would shadow a built-in name,
has an unknown kind, or points at a module that runs arbitrary code (`os`, `subprocess`,
...) is skipped with a logged warning, as is an entry point that fails to load.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from jobs.recipe.targets.spec import TargetSpec

GROUP = "tuneyard.targets"
KINDS = frozenset(
    {"optimizer", "lr_scheduler", "loss", "model", "dataset", "peft", "tokenizer", "config"}
)
# Modules whose callables run code or touch the system: never allowlisted, even by operators.
UNSAFE_MODULES = (
    "os",
    "subprocess",
    "builtins",
    "pickle",
    "shutil",
    "sys",
    "importlib",
    "socket",
    "ctypes",
    "marshal",
    "runpy",
    "code",
    "pty",
)
log = logging.getLogger("tuneyard.targets")


def _unsafe(spec: TargetSpec) -> bool:
    module = spec.import_path.partition(":")[0]
    roots = {module.split(".")[0], spec.name.split(".")[0]}
    return bool(roots & set(UNSAFE_MODULES)) or any(p.startswith("_") for p in spec.name.split("."))


def _why_skipped(spec: Any, built_in: Mapping[str, TargetSpec]) -> str:
    if not isinstance(spec, TargetSpec):
        return f"{type(spec).__name__} is not a TargetSpec"
    if spec.name in built_in:
        return f"{spec.name} would shadow a built-in target"
    if spec.kind not in KINDS:
        return f"{spec.name}: unknown kind {spec.kind!r} (one of {', '.join(sorted(KINDS))})"
    if ":" not in spec.import_path or _unsafe(spec):
        return f"{spec.name}: import_path {spec.import_path!r} is not an allowed 'module:attr'"
    return ""


def operator_specs(built_in: Mapping[str, TargetSpec]) -> dict[str, TargetSpec]:
    """The specs every installed `tuneyard.targets` entry point adds, by name."""
    found: dict[str, TargetSpec] = {}
    for point in entry_points(group=GROUP):
        try:
            loaded = point.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the API down
            log.warning("entry point %s (%s) failed to load: %s", point.name, point.value, exc)
            continue
        for spec in loaded if isinstance(loaded, list | tuple) else [loaded]:
            why = _why_skipped(spec, {**built_in, **found})
            if why:
                log.warning("entry point %s: skipped: %s", point.name, why)
                continue
            found[spec.name] = spec
    return found
