"""AutoModel keys that change nothing tuneyard trains: each checked, dropped and warned about.

A few keys of AutoModel's LLM recipes tune only AutoModel's own machinery (a loss window
its LLM recipe never reads, tokenizer processes, a pipeline shape hint, a LoRA autograd
variant) or, like a top-level `autocast:` section, are read by no LLM recipe at all.
`fold_inert_keys` runs on the raw recipe before the schema: a key's value must still be
one AutoModel accepts (a positive count, a bool, a mapping), else it is an error at its
field; an accepted one is dropped with a warning that says exactly why it has no effect
here. A value that asks for what tuneyard does anyway (`use_memory_efficient_lora:
false`, `pp_seq_len: null`) is dropped without one; `autocast: none` is no section at all
(`jobs.recipe.automodel.forms`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.load import limits

PIPELINE_BLOCKS = ("pipeline", "pipeline_config")


def _count(most: int, nullable: bool = False) -> Callable[[Any], str]:
    """A rule: an integer from 1 to `most` (or null where `nullable`); "" when it holds."""

    def rule(value: Any) -> str:
        if value is None and nullable:
            return ""
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most:
            return ""
        return f"must be an integer from 1 to {limits.at_most(most)}, got {shown(value)}"

    return rule


def _bool(value: Any) -> str:
    return "" if isinstance(value, bool) else f"must be true or false, got {shown(value)}"


def _mapping(value: Any) -> str:
    return "" if isinstance(value, dict) else f"must be a mapping, got {shown(value)}"


@dataclass(frozen=True)
class InertKey:
    """One key with no effect here: its value rule, why it changes nothing, and the values
    that ask for tuneyard's own behaviour and need no warning."""

    rule: Callable[[Any], str]
    why: str
    quiet: tuple[Any, ...] = ()


_PP_SEQ_LEN = InertKey(
    _count(limits.MAX_SEQ_LENGTH, nullable=True),
    "a sequence-length hint for AutoModel's fixed pipeline stage shapes; tuneyard builds each "
    "pipeline schedule for the batch's own shape (the stages exchange shapes), so it needs "
    "no hint",
    quiet=(None,),  # null: AutoModel infers the length itself
)
# (section, key) -> the key's rule and reason; key None: the whole top-level section.
INERT_KEYS: dict[tuple[str, str | None], InertKey] = {
    ("step_scheduler", "loss_average_window_steps"): InertKey(
        _count(limits.MAX_STEPS),
        "AutoModel's LLM recipes never read it (only its bi-encoder recipe averages the loss "
        "over a window); tuneyard logs each step's own loss",
    ),
    ("packed_sequence", "num_proc"): InertKey(
        _count(limits.MAX_DATALOADER_WORKERS),
        "it sets how many processes tokenize before packing (speed only); tuneyard tokenizes "
        "once into the datasets cache and packs the same rows",
    ),
    ("peft", "use_memory_efficient_lora"): InertKey(
        _bool,
        "AutoModel's custom-autograd LoRA path (and fused LoRA MLP) only saves activation "
        "memory; tuneyard's peft LoRA layers compute the same x·A·B·scale with plain autograd",
        quiet=(False,),
    ),
    ("autocast", None): InertKey(
        _mapping,
        "AutoModel's LLM recipes read no top-level autocast section (their forward autocast is "
        "distributed.autocast_dtype), so it changes nothing there or here: the model computes "
        "in its dtype and distributed.mp_policy's",
    ),
}


def _fold(holder: Any, key: str, loc: str, inert: InertKey) -> tuple[list[FieldError], bool]:
    """Check and drop `holder[key]`: (errors, whether a warning is due)."""
    if not isinstance(holder, dict) or key not in holder:
        return [], False
    value = holder[key]
    problem = inert.rule(value)
    if problem:
        fix = f"fix {loc}, or remove it: it changes nothing here"
        return [FieldError(loc, problem, fix)], False
    holder.pop(key)
    return [], value not in inert.quiet


Place = tuple[Any, str, str, InertKey]  # the mapping that holds the key, the key, loc, rule


def _places(data: dict[str, Any]) -> list[Place]:
    places: list[Place] = []
    for (section, key), inert in INERT_KEYS.items():
        if key is None:  # the whole top-level section
            places.append((data, section, section, inert))
        else:
            places.append((data.get(section), key, f"{section}.{key}", inert))
    distributed = data.get("distributed")
    for name in PIPELINE_BLOCKS if isinstance(distributed, dict) else ():
        loc = f"distributed.{name}.pp_seq_len"
        places.append((distributed.get(name), "pp_seq_len", loc, _PP_SEQ_LEN))
    return places


def fold_inert_keys(data: dict[str, Any]) -> tuple[list[FieldError], list[FieldError]]:
    """Check and drop the keys above from the raw recipe, in place: (errors, warnings)."""
    errors: list[FieldError] = []
    warnings: list[FieldError] = []
    for holder, key, loc, inert in _places(data):
        errs, warn = _fold(holder, key, loc, inert)
        errors += errs
        if warn:
            warnings.append(FieldError(loc, f"accepted and ignored: {inert.why}"))
    return errors, warnings
