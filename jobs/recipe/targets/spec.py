"""`TargetSpec`: one allowlisted callable a recipe may name with `_target_`.

A spec says where the callable lives (`module:attr`), its kind (which sections may name
it), the keyword names a recipe may give (static, so validation needs no torch), the ones
the trainer injects, the ones a recipe must give, which keywords take a nested built
object, and the optional packages (`requires`) a worker must be able to import to run it.
The tables of specs are `jobs.recipe.targets.table` and the per-area modules it merges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TargetSpec:
    name: str  # the canonical dotted name a recipe writes
    import_path: str  # "module:attr.path"
    kind: str  # optimizer | lr_scheduler | loss | model | dataset | peft | tokenizer | config
    params: frozenset[str] | None  # keywords a recipe may give; None = not checked here
    injected: frozenset[str] = frozenset()  # keywords the trainer supplies at run time
    required: frozenset[str] = frozenset()  # keywords a recipe must give
    # Keywords that take a built object, and the kinds of `_target_` each accepts; a
    # `_target_` under any other keyword is refused (it would be built where no one checks).
    nested: Mapping[str, frozenset[str]] = field(default_factory=dict, compare=False)
    # Import names of optional packages the callable needs (`transformer_engine`); a job
    # naming it runs only on a worker that can import each of them.
    requires: frozenset[str] = frozenset()
    # Keywords naming files to read (a path, a hub name, or a list/mapping of them): each is
    # checked against the data roots. Empty: the common ones (`jobs.recipe.paths.data`).
    paths: frozenset[str] = frozenset()
    # Path keywords that name a set of files: "megatron_prefix" (a .bin/.idx prefix, or a
    # glob of them) or "glob" (`jobs.recipe.paths.forms`).
    path_forms: Mapping[str, str] = field(default_factory=dict, compare=False)
    # Keywords that are plain names (a split, a column): never a path. Keyword -> example.
    names: Mapping[str, str] = field(default_factory=dict, compare=False)
    # A pydantic model typing the other keywords' values (extra keys ignored); None: untyped.
    values: type | None = field(default=None, compare=False)
    # Keywords accepted but not used, with why (reported as warnings at submit).
    ignored: Mapping[str, str] = field(default_factory=dict, compare=False)
    # A warning every use of the callable gets (a kernel replaced by an equivalent).
    always_warn: str = ""
    # Keywords beyond `params` are overrides of the model config's attributes: never a
    # transformers loader option, always an attribute's name (`targets.loader_kwargs`), and
    # checked against the config where it is readable at submit (`model.overrides`).
    overrides: bool = False


def spec(
    name: str,
    import_path: str,
    kind: str,
    params: Iterable[str] | None,
    injected: Iterable[str] = (),
    required: Iterable[str] = (),
    *,
    nested: Mapping[str, Iterable[str]] | None = None,
    requires: Iterable[str] = (),
    paths: Iterable[str] = (),
    path_forms: Mapping[str, str] | None = None,
    names: Mapping[str, str] | None = None,
    values: type | None = None,
    ignored: Mapping[str, str] | None = None,
    always_warn: str = "",
    overrides: bool = False,
) -> TargetSpec:
    """A `TargetSpec` from plain iterables (the tables read better without frozenset())."""
    return TargetSpec(
        name,
        import_path,
        kind,
        None if params is None else frozenset(params),
        frozenset(injected),
        frozenset(required),
        {key: frozenset(kinds) for key, kinds in (nested or {}).items()},
        frozenset(requires),
        frozenset(paths),
        dict(path_forms or {}),
        dict(names or {}),
        values,
        dict(ignored or {}),
        always_warn,
        overrides,
    )
