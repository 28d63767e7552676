"""User-facing errors as values.

Every check in tuneyard reports a `FieldError`: the dotted path of the offending field
(`loc`), what is wrong (`msg`) and how to fix it (`fix`). The API returns them as
`{"errors": [{"loc", "msg", "fix"}]}`, the CLI prints them, and the trainer exits with
code 2 when a recipe has any. `RecipeInvalid` carries a list of them across call boundaries.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    loc: str
    msg: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"loc": self.loc, "msg": self.msg, "fix": self.fix}

    def __str__(self) -> str:
        text = f"{self.loc}: {self.msg}"
        return f"{text} (fix: {self.fix})" if self.fix else text


class RecipeInvalid(Exception):
    """Raised when a recipe has one or more FieldErrors."""

    def __init__(self, errors: Iterable[FieldError]):
        self.errors = list(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' Did you mean X?' suffix when a close match exists, else ''."""
    match = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else ""
