"""Loading recipe text (YAML or JSON) with the number rules people expect.

PyYAML follows YAML 1.1, where `1e-8` (no dot) is a string; recipes write learning rates
that way, so `RecipeLoader` also reads `1e-8`, `2E5` and `.5e-3` as floats. JSON is YAML, so
the same loader reads both. A key given twice in one mapping is an error (YAML would keep
the last one silently). `parse_scalar` types one command-line override value.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_FLOAT = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)$")


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader plus exponent floats without a dot; a key given twice is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


RecipeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """Parse YAML or JSON text; raises yaml.YAMLError on bad syntax."""
    return yaml.load(text, Loader=RecipeLoader)  # noqa: S506 - a SafeLoader subclass


def parse_scalar(text: str) -> Any:
    """Type one override value: int, float, bool, null (also None/none), list, dict, str."""
    if text.strip() in {"None", "none"}:
        return None
    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        return text
    return (
        text if value is None and text.strip() not in {"null", "~", "Null", "NULL", ""} else value
    )
