"""The recipe as the OpenAPI document describes it: the JSON Schema of `JobCreate.recipe`.

It is generated from the recipe's own pydantic sections (`jobs.recipe.load.schema`), so an
editor pointed at `/openapi.json` completes section and field names and shows their
defaults. It is advisory by design, and the API accepts exactly what it accepted before:
AutoModel's spellings are folded onto the canonical ones before the sections are checked
(`checkpoint.save_consolidated: final`, `local_batch_size: none`, `val_every_steps`, a
`_target_` marker in a fixed section, a null optional section, AutoModel side sections), so
the strict section schemas would make an editor reject recipes the API runs. Hence no
`required`, no `additionalProperties: false` and no type on a field: each field keeps its
name, title, description and default, and its canonical schema under `x-canonical`, which
editors ignore and generated clients may read. The recipe validator (`POST
/v1/jobs:validate`) stays the one judge of a recipe.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from jobs.recipe.load.schema import FIXED_SECTIONS, TARGET_SECTIONS, PeftSection

_KEPT = ("title", "description", "default")
_TARGET_DOC = (
    "A built object: `_target_` names an allowed class or function, the other keys are its "
    "keyword arguments."
)
# Top-level keys that are neither a fixed nor a `_target_` section.
_OTHER_KEYS: dict[str, str] = {
    "recipe": "The recipe kind: llm_finetune (default) or llm_kd, or AutoModel's class name.",
    "seed": "Shorthand for rng.seed.",
    "distributed": "Parallelism: strategy, dp_size, tp_size, pp_size, cp_size, ep_size.",
    "restore_from": "Resume from {path: LATEST}, {path: <checkpoint dir>}, {job, step} or "
    "{path: s3://...}, a checkpoint in the artifact store.",
    "kd_ratio": "llm_kd: the weight of the distillation loss.",
    "benchmark": "Benchmark settings (llm_benchmark recipes).",
    "wandb": "Weights & Biases tracker settings.",
    "mlflow": "MLflow tracker settings.",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`node` with a `$ref` replaced by its definition, and an optional (`X | None`)
    nested section unwrapped to the section."""
    if "$ref" in node:
        return defs[node["$ref"].rsplit("/", 1)[-1]]
    for member in node.get("anyOf", ()):
        member = _resolve(member, defs)
        if "properties" in member:
            return member
    return node


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `$ref` replaced by its definition (the sections do not recurse)."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(_resolve(node, defs), defs)
        return {key: _inline(value, defs) for key, value in node.items() if key != "$defs"}
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    return node


def _advisory(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A section's schema with its names and documentation but no constraint."""
    section = _resolve(node, defs)
    kept = {key: node[key] for key in _KEPT if key in node}
    if "properties" not in section:
        return {**kept, "x-canonical": _inline(node, defs)}
    properties = {name: _advisory(value, defs) for name, value in section["properties"].items()}
    return {**kept, "title": section.get("title", kept.get("title")), "properties": properties}


def _section(model: Any) -> dict[str, Any]:
    schema = model.model_json_schema()
    return _advisory(schema, schema.get("$defs", {}))


@cache
def recipe_json_schema() -> dict[str, Any]:
    """The recipe's advisory JSON Schema (see the module docstring for why advisory)."""
    properties: dict[str, Any] = {name: _section(cls) for name, cls in FIXED_SECTIONS.items()}
    properties["peft"] = _section(PeftSection)
    for name in TARGET_SECTIONS:
        properties[name] = {
            "description": _TARGET_DOC,
            "properties": {"_target_": {"description": "The allowed target's dotted name."}},
        }
    properties.update({name: {"description": doc} for name, doc in _OTHER_KEYS.items()})
    return {
        "type": "object",
        "title": "Recipe",
        "description": "A fine-tuning recipe as an object (the same document as "
        "`recipe_yaml`). Advisory: AutoModel's spellings are accepted too; "
        "`POST /v1/jobs:validate` is the judge.",
        "properties": properties,
    }
