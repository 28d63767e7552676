"""`validate_job`: the one check every job passes before it is queued or trained.

It loads a recipe (dict, YAML/JSON text or a file), applies command-line overrides, checks
every section against the schema (`jobs.recipe.load.schema`), the `_target_` allowlist
(`jobs.recipe.targets.allowlist`), the topology rules (`jobs.recipe.topology.setup`), the model's capabilities
(`models.registry`, torch-free), the allowed filesystem roots and the batch arithmetic, and
returns a `ValidationResult`: all errors at once, the warnings (what was accepted but is not
used), the normalized recipe the trainer reads,
the DistributedSetup, and a plan (world size, mesh, batches, tokens per step, model size,
the memory/time estimate; given the device memory, a job that cannot fit is refused).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.recipe.automodel.families import recipe_family
from jobs.recipe.errors import QUOTE_MAX, FieldError, RecipeInvalid, clip
from jobs.recipe.load.bounds import NodeBudget, check_bounds
from jobs.recipe.load.normalize import normalize_recipe
from jobs.recipe.load.overrides import LOC, apply_overrides, too_many, typed_overrides
from jobs.recipe.load.schema_errors import field_errors
from jobs.recipe.load.yaml_loader import LimitExceeded, load_yaml
from jobs.recipe.paths.scope import JobScope
from jobs.recipe.plan.grants import REMOTE_CODE, required_grants
from jobs.recipe.plan.memory_fit import fit_check
from jobs.recipe.plan.plan import build_plan
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.topology.setup import DistributedSetup
from jobs.recipe.typed import Recipe, build_recipe, is_stored_recipe, recipe_sections
from models.registry import capabilities_for

FILE_LOC = "<recipe>"
UNCHECKED_MEMORY = FieldError(
    "distributed",
    "the memory per rank was not checked against the device: the model's sizes or the "
    "sequence length are not known here",
    "give dataset.max_seq_length and a model whose config.json is readable here",
)


class Resources(BaseModel):
    """What a job runs on: nodes, processes (accelerators) per node, accelerator kind."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    nnodes: Annotated[int, Field(gt=0)] = 1
    nproc_per_node: Annotated[int, Field(gt=0)] = 1
    accelerator: Literal["cpu", "cuda"] = "cpu"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass
class ValidationResult:
    valid: bool
    errors: list[FieldError] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] | None = None  # `typed.to_json()`: what is stored and run
    setup: DistributedSetup | None = None
    typed: Recipe | None = None
    # Accepted but not used (AutoModel side sections, ignored kwargs): loc, msg, fix-or-empty.
    warnings: list[FieldError] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "errors": [e.to_dict() for e in self.errors],
            "warnings": [w.to_dict() for w in self.warnings],
            "plan": self.plan,
        }


def load_recipe(
    recipe: dict[str, Any] | str | Path, budget: NodeBudget | None = None
) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """A recipe dict from a dict, YAML/JSON text, or a file path, within `jobs.recipe.load.bounds`
    and the request's `budget`. A dict is copied: normalization edits the copy, never the
    caller's dict."""
    budget = budget if budget is not None else NodeBudget()
    if isinstance(recipe, dict):  # checked before copying: a deep one would crash deepcopy
        out_of_bounds = check_bounds(recipe, budget=budget)
        return (None, out_of_bounds) if out_of_bounds else (copy.deepcopy(recipe), [])
    text = recipe
    if isinstance(recipe, Path) or (
        "\n" not in recipe and recipe.endswith((".yaml", ".yml", ".json"))
    ):
        try:
            text = Path(recipe).read_text()
        except OSError as exc:
            return None, [
                FieldError(
                    FILE_LOC,
                    f"cannot read {recipe}: {exc.strerror}",
                    "give an existing recipe file",
                )
            ]
        except UnicodeDecodeError:
            return None, [FieldError(FILE_LOC, f"{recipe} is not UTF-8 text", "save it as UTF-8")]
    try:
        data = load_yaml(str(text), budget)
    except LimitExceeded as exc:
        return None, [exc.error]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = f": {exc.problem}" if getattr(exc, "problem", None) else ""
        return None, [
            FieldError(FILE_LOC, f"not valid YAML or JSON{where}{problem}", "fix the recipe syntax")
        ]
    if not isinstance(data, dict):
        return None, [
            FieldError(
                FILE_LOC,
                "must be a mapping of sections",
                "start the recipe with sections such as model: and dataset:",
            )
        ]
    out_of_bounds = check_bounds(data, budget=budget)
    return (None, out_of_bounds) if out_of_bounds else (data, [])


def coerce_resources(
    resources: Resources | dict[str, Any] | None,
) -> tuple[Resources, list[FieldError]]:
    if isinstance(resources, Resources):
        return resources, []
    try:
        return Resources.model_validate(resources or {}), []
    except ValidationError as exc:
        return Resources(), field_errors(exc, "resources", Resources.model_fields)


def _overrides(
    overrides: Any, budget: NodeBudget
) -> tuple[list[tuple[str, Any]], list[FieldError]]:
    if not overrides:
        return [], []
    if isinstance(overrides, dict):  # {"optimizer.lr": 1e-4}: already typed
        crowded = too_many(len(overrides))
        if crowded:
            return [], [crowded]
        return _bounded(((str(k), v) for k, v in overrides.items()), budget)
    try:
        tokens = list(overrides) if not isinstance(overrides, str) else overrides
        return _bounded(typed_overrides(tokens, budget), budget)
    except RecipeInvalid as exc:
        return [], exc.errors


def _bounded(
    pairs: Iterable[tuple[str, Any]], budget: NodeBudget
) -> tuple[list[tuple[str, Any]], list[FieldError]]:
    """The overrides whose values are within bounds; each other one is an error at its key.
    Each value is checked before the next is parsed, against the one budget: once it is
    spent, the rest are neither parsed nor applied."""
    kept: list[tuple[str, Any]] = []
    errors: list[FieldError] = []
    pending = iter(pairs)
    for key, value in pending:
        problems = check_bounds(value, key, budget)
        errors += [FieldError(e.loc, f"{e.msg}{_set_by(key)}", e.fix) for e in problems]
        if not problems:
            kept.append((key, value))
        if budget.exhausted:
            rest = next(pending, None)  # with nothing left, parsing stops at its first value
            if rest is not None:
                errors.append(_unchecked(rest[0]))
            break
    return kept, errors


def _unchecked(key: str) -> FieldError:
    return FieldError(
        LOC,
        f"--{clip(key, QUOTE_MAX)} and the overrides after it were not checked: the request "
        "is over its limits already",
        "fix the errors reported before it",
    )


def _set_by(key: str) -> str:
    return f" (set by override --{clip(key, QUOTE_MAX)})"


def _mark_overridden(errors: list[FieldError], keys: set[str]) -> list[FieldError]:
    """Say which errors an override caused, so a CLI typo is easy to spot."""
    marked, seen = [], set()
    for err in errors:
        key = next(
            (
                k
                for k in keys
                if err.loc == k or err.loc.startswith(k + ".") or k.startswith(err.loc + ".")
            ),
            None,
        )
        if key is not None and not err.msg.endswith(_set_by(key)):
            err = FieldError(err.loc, f"{err.msg}{_set_by(key)}", err.fix)
        if (err.loc, err.msg) not in seen:
            seen.add((err.loc, err.msg))
            marked.append(err)
    return marked


def validate_job(
    recipe: dict[str, Any] | str | Path,
    overrides: Any = (),
    resources: Resources | dict[str, Any] | None = None,
    settings: RecipeSettings | None = None,
    allow_remote_code: bool = False,
    *,
    scope: JobScope | None = None,
    device_memory: int | None = None,
    flops_per_rank: float | None = None,
    budget: NodeBudget | None = None,
) -> ValidationResult:
    """Check everything about a job; never raises for bad input.

    `allow_remote_code` is the project's grant; the operator's (`settings`) also allows it.
    `scope` is the caller's project (the server's): run-dir paths stay in its own runs.
    `device_memory` (bytes per device, the queue's workers' or a declared one) refuses a
    job whose memory estimate cannot fit (`jobs.recipe.plan.memory_fit`); `flops_per_rank` is
    the queue's learned throughput behind the estimate's time. `budget` is the request's
    input budget, shared by the recipe and every override (the API passes the one its early
    check used). A dict `recipe` is copied, never changed.
    """
    settings = settings or RecipeSettings()
    if allow_remote_code and not settings.allow_remote_code:
        settings = settings.model_copy(update={"allow_remote_code": True})
    res, errors = coerce_resources(resources)
    budget = budget if budget is not None else NodeBudget()
    data, load_errors = load_recipe(recipe, budget)
    pairs, override_errors = _overrides(overrides, budget)
    errors += load_errors + override_errors
    if data is None:
        return ValidationResult(False, errors, build_plan(None, None, res, None))
    if is_stored_recipe(data):  # a recipe this service stored: its sections, re-checked
        data = recipe_sections(data)
    if pairs:  # `data` is this call's own (parsed or copied)
        data, apply_errors = apply_overrides(data, pairs)
        errors += apply_errors
    family = recipe_family(data)
    if family is not None:  # another family's recipe: that is the answer, not its details
        return ValidationResult(False, [family], build_plan(None, None, res, None))
    normalized, setup, info, recipe_errors, warnings = normalize_recipe(data, res, settings, scope)
    errors = _mark_overridden(errors + recipe_errors, {k for k, _ in pairs})
    plan = build_plan(normalized, setup, res, info, flops_per_rank)
    if device_memory is not None and not errors:
        supports_tp = capabilities_for(info.architecture if info else None).supports_tp
        errors = fit_check(plan.get("estimate"), device_memory, supports_tp)
        if plan.get("estimate") is None:
            warnings = [*warnings, UNCHECKED_MEMORY]
    # The student's or a KD teacher's own Python runs (what a worker asks again at its claim).
    plan["trust_remote_code"] = REMOTE_CODE in required_grants(normalized)
    plan["warnings"] = [w.to_dict() for w in warnings]
    if errors or setup is None:
        return ValidationResult(False, errors, plan, None, setup, warnings=warnings)
    typed = build_recipe(normalized, setup.mesh_shape, res, plan)
    return ValidationResult(True, [], plan, typed.to_json(), setup, typed, warnings)


__all__ = ["Resources", "ValidationResult", "load_recipe", "validate_job"]
