"""AutoModel's losses, optimizers from optional packages and config loaders: their specs,
aliases and keyword synonyms, merged into the allowlist by `jobs.recipe.target_table`.
"""

from __future__ import annotations

from jobs.recipe.target_spec import TargetSpec

SPECS: list[TargetSpec] = []
ALIASES: dict[str, str] = {}
SYNONYMS: dict[str, dict[str, str]] = {}
