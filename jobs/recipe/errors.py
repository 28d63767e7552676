"""User-facing errors as values.

Every check in tuneyard reports a `FieldError`: the dotted path of the offending field
(`loc`), what is wrong (`msg`) and how to fix it (`fix`). The API returns them as
`{"errors": [{"loc", "msg", "fix"}]}`, the CLI prints them, and the trainer exits with
code 2 when a recipe has any. `RecipeInvalid` carries a list of them across call boundaries.

An error quotes what the user gave through `shown` (a repr of at most `QUOTE_MAX`
characters), and a `FieldError` cuts its own texts to `LOC_MAX` / `MSG_MAX` / `FIX_MAX`: an
answer stays small whatever a request holds (a 4 KB override, an alias expanded to
thousands of values, a key of 64 K characters).
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass

QUOTE_MAX = 100  # characters of a user's value an error quotes
LOC_MAX = 300  # a field path: keys are the user's too
MSG_MAX = 1_000
FIX_MAX = 2_000  # a fix may list every accepted name (the `_target_` allowlist)
ELLIPSIS = "…"


class _Quote(reprlib.Repr):
    """Containers a few entries and levels deep (a shared list repeated a million times is
    never expanded only to be cut); an integer of thousands of digits by its size, since
    printing it is slow and past 4300 digits raises."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 8
        self.maxstring = self.maxother = self.maxlong = QUOTE_MAX

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4 * self.maxlong:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_QUOTE = _Quote()


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and an ellipsis."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + ELLIPSIS


def shown(value: object, limit: int = QUOTE_MAX) -> str:
    """How an error quotes a value the user gave: its repr, cut to `limit` characters."""
    if isinstance(value, str):  # cut before repr: a 64 K string is not copied to be cut
        return clip(repr(value[: limit + 1]), limit)
    return clip(_QUOTE.repr(value), limit)


@dataclass(frozen=True)
class FieldError:
    loc: str
    msg: str
    fix: str = ""

    def __post_init__(self) -> None:
        for name, limit in (("loc", LOC_MAX), ("msg", MSG_MAX), ("fix", FIX_MAX)):
            text = getattr(self, name)
            if isinstance(text, str) and len(text) > limit:
                object.__setattr__(self, name, clip(text, limit))

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
