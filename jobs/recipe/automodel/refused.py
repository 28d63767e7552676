"""AutoModel features tuneyard's trainer does not run, each answered with why and the fix.

Without these rules such a recipe would get a bare "unknown section" or "not on the
allowlist"; here each one names what AutoModel does with it and what to change. Sections
(`SECTIONS`) are taken out of the raw recipe before the schema: one that changes the
trained model is an error unless it says `enabled: false` (then it is dropped with a
warning), one that only evaluates is dropped with a warning saying so. A collate function
(`COLLATE_FNS`) is an error at the loader's `collate_fn`. Dataset builders and other
callables with their reasons are `jobs.recipe.targets.refused`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.recipe.errors import FieldError


@dataclass(frozen=True)
class RefusedSection:
    what: str  # what AutoModel does with the section
    why: str  # why tuneyard does not: for an error, or for a warning when `warn_only`
    fix: str = ""
    warn_only: bool = False  # it changes nothing that is trained: accepted with a warning


SECTIONS: dict[str, RefusedSection] = {
    "separate_meshes": RefusedSection(
        "AutoModel runs the distillation teacher on a device mesh of its own "
        "(`teacher_distributed`: other tp, pp or cp sizes over the same ranks, each teacher "
        "group gathering its students' batches)",
        "tuneyard's trainer shards the teacher like the student (the student's data-parallel "
        "mesh, no tp/pp/cp of its own), so it would not run the layout given",
        "remove separate_meshes and teacher_distributed: the teacher is then sharded like the "
        "student under FSDP2",
    ),
    "teacher_distributed": RefusedSection(
        "AutoModel lays the distillation teacher out on its own tp, pp and cp sizes",
        "tuneyard's trainer shards the teacher like the student, on the student's mesh",
        "remove teacher_distributed (and separate_meshes): the teacher is sharded like the "
        "student under FSDP2",
    ),
    "tool_call_eval": RefusedSection(
        "AutoModel's tool-call accuracy evaluator generates answers during training (under "
        "FSDP2 only with run_on_fsdp2: true)",
        "it measures, it does not change training; tuneyard's validation reports the loss "
        "only, so no tool-call accuracy is logged",
        warn_only=True,
    ),
}

PREFIX_TREE = "nemo_automodel.components.datasets.llm.prefix_tree.prefix_tree_collate_fn"
COLLATE_FNS: dict[str, tuple[str, str]] = {
    PREFIX_TREE: (
        "packs rollouts that share a prompt into one prefix tree with a tree attention mask; "
        "tuneyard's models attend causally within each row, so the branches would attend to "
        "each other",
        "train on each prompt + completion as its own row (ChatDataset or "
        "ColumnMappedTextInstructionDataset) with the default collater",
    ),
}


def _section_notes(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    errors, warnings = [], []
    for name, rule in SECTIONS.items():
        if name not in data:
            continue
        value = data.pop(name)
        if rule.warn_only:
            warnings.append(FieldError(name, f"accepted and ignored: {rule.what}; {rule.why}"))
        elif value in (None, False) or (isinstance(value, dict) and value.get("enabled") is False):
            warnings.append(FieldError(name, "accepted and ignored: it is not enabled"))
        else:
            errors.append(FieldError(name, f"{rule.what}; {rule.why}", rule.fix))
    return errors, warnings


def _collate_errors(data: dict[str, Any]) -> list[FieldError]:
    errors = []
    for loader in ("dataloader", "validation_dataloader"):
        section = data.get(loader)
        value = section.get("collate_fn") if isinstance(section, dict) else None
        name = value.get("_target_") if isinstance(value, dict) else value
        if isinstance(name, str) and name in COLLATE_FNS:
            section.pop("collate_fn")
            why, fix = COLLATE_FNS[name]
            errors.append(FieldError(f"{loader}.collate_fn", f"{name} {why}", fix))
    return errors


def refused_features(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """Take the sections and collaters above out of the raw recipe: (errors, warnings)."""
    errors, warnings = _section_notes(data)
    return errors + _collate_errors(data), warnings
