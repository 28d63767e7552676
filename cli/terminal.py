"""What the CLI prints that it did not write itself, made safe to show on a terminal.

Job names, labels, states, error texts and log lines come from the server (and error texts
from recipes): a control character in one (ESC, BEL, CR, C1 codes) or a bidirectional
override would move the cursor, retitle the window or reorder the line instead of showing.
`printable` writes each such character as its escape (`\\x1b`, `\\u202e`), with the rules
of `jobs.recipe.load.bounds.escaped`, the ones the server refuses names by; `markup_safe`
also escapes rich markup, for text printed inside a rich markup string or a table cell.
"""

from __future__ import annotations

from jobs.recipe.load.bounds import escaped


def printable(value: object, keep: str = "") -> str:
    """`str(value)` with control and bidirectional characters escaped (those in `keep`
    stay: a log line keeps its tabs)."""
    return escaped(str(value), keep)


def markup_safe(value: object) -> str:
    """`printable(value)` with rich markup escaped: `[red]` shows as `[red]`."""
    from rich.markup import escape

    return escape(printable(value))
