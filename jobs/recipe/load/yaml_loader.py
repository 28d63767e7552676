"""Loading recipe text (YAML or JSON) with the number rules people expect, within bounds.

PyYAML follows YAML 1.1, where `1e-8` (no dot) is a string; recipes write learning rates
that way, so `RecipeLoader` also reads `1e-8`, `2E5` and `.5e-3` as floats. JSON is YAML, so
the same loader reads both. A key given twice in one mapping is an error (YAML would keep
the last one silently); a key that a `<<` merge brings in may be set again, which is what
merge keys are for. `parse_scalar` types one command-line override value.

The loader never builds more than the limits in `jobs.recipe.load.bounds` allow: while composing
it counts every value, an alias counting as the whole value it repeats, so an alias bomb
stops once it would overdraw the request's `NodeBudget` (what the recipe and the overrides
before it have left of `MAX_NODES`) instead of expanding; nesting stops at `MAX_DEPTH` (before
Python's recursion limit would) and one list or mapping at `MAX_ITEMS` entries, so a huge
flow list is refused without parsing all of it. Those raise `LimitExceeded`, located at the
field. Values JSON cannot hold (dates, `!!binary`, `!!set`, `!!omap`, unknown or python
tags, integers of thousands of digits) load as `Refused` markers, which `check_bounds`
reports at their field with a fix.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from jobs.recipe.errors import FieldError, clip, shown
from jobs.recipe.load.bounds import (
    MAX_DEPTH,
    MAX_ITEMS,
    NodeBudget,
    Refused,
    join_loc,
    long_int,
)

_FLOAT = re.compile(r"\A[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)\Z")
_MERGE = "tag:yaml.org,2002:merge"
_STANDARD = "tag:yaml.org,2002:"
NOT_PLAIN_FIX = "remove the tag; a recipe holds plain values (a _target_ names what to build)"


class LimitExceeded(yaml.YAMLError):
    """The loader stopped early: nesting too deep, too many values, an alias cycle."""

    def __init__(self, error: FieldError):
        self.error = error
        super().__init__(str(error))


def _step(index: Any) -> str | None:
    """The path part for a node composed at `index` (None for a mapping key or the root)."""
    if isinstance(index, int):
        return str(index)
    if isinstance(index, yaml.ScalarNode):
        return str(index.value)
    return None if index is None else "?"


# libyaml's parser (bundled in PyYAML's wheels) reads events about four times faster than
# the pure-Python one; composing stays in Python, where the limits are counted.
try:
    from yaml.cyaml import CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    CParser = None

if CParser is not None:

    class _Events(yaml.composer.Composer, CParser):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)

else:  # pragma: no cover

    class _Events(
        yaml.composer.Composer, yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser
    ):
        def __init__(self, stream: str) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)


class RecipeLoader(_Events, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """SafeLoader's rules plus exponent floats without a dot, duplicate-key errors and the
    limits. It reads `budget` (the walk in `check_bounds` spends it): a value larger than
    what is left would be refused there, so it is refused here before it is built, and the
    budget is overdrawn: the request is over its limit."""

    def __init__(self, stream: str, budget: NodeBudget | None = None) -> None:
        _Events.__init__(self, stream)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._path: list[str | None] = []  # one step per node being composed
        self._counts: list[int] = []  # entries composed so far, per open node
        self._values = 0  # values composed, aliases counted at their full size
        self._sizes: dict[str, int] = {}  # anchor -> values it stands for, once complete
        self._budget = budget if budget is not None else NodeBudget()

    def _loc(self, depth: int | None = None) -> str:
        return join_loc([s for s in self._path[:depth] if s is not None])

    def _loc_of(self, index: Any) -> str:
        """Where the value being composed at `index` of the current node sits."""
        return join_loc([s for s in [*self._path, _step(index)] if s is not None])

    def _exceeded(self, loc: str, msg: str, fix: str) -> LimitExceeded:
        return LimitExceeded(FieldError(loc, msg, fix))

    def _alias_size(self, event: yaml.AliasEvent, index: Any) -> int:
        if event.anchor in self.anchors and event.anchor not in self._sizes:
            raise self._exceeded(
                self._loc_of(index),
                f"uses the alias *{clip(event.anchor, 100)} inside the value it names (a cycle)",
                "alias only a value that is complete before the alias",
            )
        return self._sizes.get(event.anchor, 1)

    def _count_value(self, parent: yaml.Node | None, index: Any, size: int) -> None:
        if parent is not None and index is None:
            return  # a mapping key: the entry is counted at its value
        if self._counts:
            self._counts[-1] += 1
            if self._counts[-1] > MAX_ITEMS:
                raise self._exceeded(
                    self._loc(),
                    f"has more than {MAX_ITEMS} entries",
                    "shorten it, or point to a file holding the data",
                )
        self._values += size
        if self._values > self._budget.left:
            self._budget.overdraw()
            raise self._exceeded(
                self._loc_of(index),
                f"makes the request larger than {self._budget.limit} values, recipe and "
                "overrides together (an alias counts as the whole value it repeats)",
                "write the values out, or alias smaller ones",
            )

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._count_value(parent, index, self._alias_size(event, index))
            return super().compose_node(parent, index)
        start = self._values
        self._count_value(parent, index, 1)
        self._path.append(_step(index))
        self._counts.append(0)
        if len(self._path) > MAX_DEPTH + 1:  # the root's step is None and not a level
            raise self._exceeded(
                self._loc(-1),
                f"nests deeper than {MAX_DEPTH} levels",
                "flatten this value; recipes need only a few levels",
            )
        node = super().compose_node(parent, index)
        self._path.pop()
        self._counts.pop()
        if event.anchor is not None:
            self._sizes[event.anchor] = max(1, self._values - start)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue  # `<<`: flatten_mapping merges it; local keys may override
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown(key)} is given twice", key_node.start_mark
                )
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int | Refused:
        return long_int(str(node.value)) or super().construct_yaml_int(node)


def _refuse(what: str, fix: str) -> Any:
    return lambda _loader, _node: Refused(what, fix)


def _refuse_timestamp(_loader: RecipeLoader, node: yaml.Node) -> Refused:
    text = clip(str(node.value), 100)
    return Refused(
        f"a date or time ({text} is a YAML timestamp)", f"quote it as a string: '{text}'"
    )


def _refuse_tag(_loader: RecipeLoader, node: yaml.Node) -> Refused:
    tag = clip(str(node.tag).replace(_STANDARD, "!!"), 100)
    return Refused(f"tagged {tag}, which a recipe cannot hold", NOT_PLAIN_FIX)


RecipeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
RecipeLoader.add_constructor("tag:yaml.org,2002:int", RecipeLoader.construct_yaml_int)
RecipeLoader.add_constructor("tag:yaml.org,2002:timestamp", _refuse_timestamp)
RecipeLoader.add_constructor(
    "tag:yaml.org,2002:binary",
    _refuse("!!binary data", "give the data as a string, or point to a file holding it"),
)
RecipeLoader.add_constructor(
    "tag:yaml.org,2002:set", _refuse("a !!set", "write it as a list: [a, b]")
)
for _ordered in ("omap", "pairs"):
    RecipeLoader.add_constructor(
        f"tag:yaml.org,2002:{_ordered}",
        _refuse(f"an ordered mapping (!!{_ordered})", "write it as a plain mapping"),
    )
RecipeLoader.add_constructor(None, _refuse_tag)


def load_yaml(text: str, budget: NodeBudget | None = None) -> Any:
    """Parse YAML or JSON text; raises yaml.YAMLError on bad syntax (`LimitExceeded`, a
    subclass, past a limit or past what `budget` has left). Refused values come back as
    `Refused` markers."""
    try:
        loader = RecipeLoader(text, budget)  # what yaml.load does, with the budget passed in
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeEncodeError as exc:  # a lone surrogate: libyaml reads UTF-8 only
        raise yaml.reader.ReaderError(
            "<unicode string>",
            exc.start,
            ord(text[exc.start]),
            "utf-8",
            "lone surrogates are not text",
        ) from exc


def parse_scalar(text: str, budget: NodeBudget | None = None) -> Any:
    """Type one override value: int, float, bool, null (also None/none), list, dict, str;
    one larger than what `budget` has left is a `Refused` marker, never built."""
    if text.strip() in {"None", "none"}:
        return None
    try:
        value = load_yaml(text, budget)
    except LimitExceeded as exc:  # too big to be a string the user meant: say why
        return Refused(f"a value that {exc.error.msg}", exc.error.fix)
    except yaml.YAMLError:
        return text
    return (
        text if value is None and text.strip() not in {"null", "~", "Null", "NULL", ""} else value
    )
