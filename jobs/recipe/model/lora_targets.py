"""LoRA module patterns: what peft is handed for them, and the submit rule where names are known.

`lora_targets` turns `peft.target_modules` / `peft.exclude_modules` into what peft reads: a
list of plain names as is (peft matches a list by name suffix), or, with any glob (`*_proj`),
one regex over the full module name in which a plain name still matches as a suffix.
`selects` is peft's own test of a module name against either form. The trainer, the LoRA
FLOP count and the rule below all read patterns through these two, so a pattern selects the
same modules everywhere.

`lora_target_errors`: for a hybrid family (`jobs.recipe.model.hybrid_modules`), whose module
names the config alone gives, the patterns are resolved at submit. A target pattern that
matches no module, a match that LoRA cannot train (a Mamba mixer's out_proj or conv1d, a
convolution, a router, a norm or container) and an exclusion that leaves nothing to adapt are
refused at their peft field, with the `exclude_modules` entries (or narrower targets) that fix
it. These are refused, not silently excluded with a warning: the stored recipe is what runs,
and the plan's adapter count, FLOPs and memory, the exported adapter_config.json and the run
all follow the patterns as written; narrowing them behind the user's back would train other
layers than the recipe says, and a warning is easy to miss where a one-line fix is not.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.model.hybrid_modules import Module, hybrid_family, hybrid_modules
from models.registry import capabilities_for, registered_architectures

GLOB_CHARS = frozenset("*?[")

PeftTargets = list[str] | str  # a suffix list, or one full-name regex


def lora_targets(patterns: list[str] | None) -> PeftTargets | None:
    """Module names for peft: a list of names as is; with any glob (`*_proj`), one regex.

    peft matches a list by name suffix and a string as a regex over the full module name;
    a glob matches the full name (`model.layers.0.self_attn.q_proj`), a plain name its suffix.
    """
    if not patterns or not any(GLOB_CHARS & set(p) for p in patterns):
        return patterns
    parts = [
        fnmatch.translate(p) if GLOB_CHARS & set(p) else rf"(?:.*\.)?{re.escape(p)}"
        for p in patterns
    ]
    return "|".join(f"(?:{part})" for part in parts)


def selects(targets: PeftTargets, name: str) -> bool:
    """Whether peft picks module `name` for `targets` (`lora_targets`'s form): a regex must
    match the whole name, a listed name must equal it or end it after a dot."""
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith(f".{t}") for t in targets)


def lora_target_errors(
    config: dict[str, Any] | None, peft: dict[str, Any] | None, model: dict[str, Any] | None
) -> list[FieldError]:
    """Patterns of a hybrid family's recipe that would fail or train nothing in the trainer.

    Other architectures are not checked here (their Hugging Face or native class may name
    modules differently), nor is a model whose own code loads: `trust_remote_code` with a
    config that has an `auto_map` (without one, transformers loads its own class, and its
    module names apply)."""
    remote = bool((model or {}).get("trust_remote_code")) and bool((config or {}).get("auto_map"))
    modules = hybrid_modules(config) if peft and not remote else None
    family = hybrid_family(config)
    if modules is None or family is None or peft is None:
        return []
    patterns = peft.get("target_modules")
    all_linear = bool(peft.get("match_all_linear")) or not patterns
    if all_linear:
        chosen = [m for m in modules if m.linear and m.name != "lm_head"]
        loc, errors = "peft.match_all_linear", []
    else:
        form = lora_targets(patterns) or []
        chosen = [m for m in modules if selects(form, m.name)]
        loc, errors = "peft.target_modules", _unmatched(patterns, modules, family.architecture)
    exclude = list(peft.get("exclude_modules") or [])
    excluded = lora_targets(exclude) or []
    kept = [m for m in chosen if not (exclude and selects(excluded, m.name))]
    if chosen and not kept:
        return [*errors, _nothing_left(exclude, family.architecture)]
    refused = [m for m in kept if m.refusal]
    if refused:
        what = "every linear layer" if all_linear else shown(patterns)
        errors.append(_refusal(loc, what, family.architecture, refused, kept, modules, exclude))
    return errors


# The routed experts' module name in every MoE family's (native or Hugging Face) tree.
_EXPERTS_MODULE = "model.layers.0.mlp.experts"


def expert_target_errors(
    experts: bool | None, architecture: str | None, peft: dict[str, Any] | None
) -> list[FieldError]:
    """A target pattern that reaches the routed experts of a model with experts (`experts`:
    its config says so) whose family does not adapt them
    (`ModelCapabilities.supports_expert_lora`): the trainer would refuse."""
    patterns = (peft or {}).get("target_modules")
    if not patterns or (peft or {}).get("match_all_linear") or not experts:
        return []
    if capabilities_for(architecture).supports_expert_lora:
        return []
    if not selects(lora_targets(patterns) or [], _EXPERTS_MODULE):
        return []
    msg = (
        f"{shown(patterns)} selects the routed experts (mlp.experts), which tuneyard's LoRA "
        f"adapts only for {', '.join(expert_lora_architectures())}, not {architecture}"
    )
    fix = "target linear layers by name instead, e.g. ['*_proj'] (the experts stay frozen)"
    return [FieldError("peft.target_modules", msg, fix)]


def expert_lora_architectures() -> list[str]:
    return sorted(
        e.architecture for e in registered_architectures() if e.capabilities.supports_expert_lora
    )


def _unmatched(patterns: list[str], modules: list[Module], architecture: str) -> list[FieldError]:
    """One error naming the patterns that select nothing: peft fails when none matches and
    silently drops one that does not, which is a typo's usual fate."""
    dead = [p for p in patterns if not _selects_any([p], modules)]
    if not dead:
        return []
    trainable = _names(m.layer_name for m in modules if m.linear and not m.refusal)
    return [
        FieldError(
            "peft.target_modules",
            f"{shown(dead)} match no module of {architecture}, so LoRA would adapt nothing "
            "there (peft refuses a target list that matches nothing)",
            "name modules it has: a plain name matches the end of a module name (q_proj, "
            "self_attn.q_proj), a glob the full name (*.self_attn.*_proj); the layers LoRA "
            f"can train: {', '.join(trainable)}",
        )
    ]


def _nothing_left(exclude: list[str], architecture: str) -> FieldError:
    return FieldError(
        "peft.exclude_modules",
        f"{shown(exclude)} excludes every module the targets select on {architecture}: "
        "nothing would train (peft refuses it)",
        "exclude fewer modules, or target others",
    )


def _refusal(
    loc: str,
    what: str,
    architecture: str,
    refused: list[Module],
    kept: list[Module],
    modules: list[Module],
    exclude: list[str],
) -> FieldError:
    """The refused modules by reason, and the shorter of two fixes that validate: excluding
    them, or targeting only what trains."""
    reasons: dict[str, dict[str, int]] = {}
    for module in refused:
        named = reasons.setdefault(str(module.refusal), {})
        named[_shown_name(module)] = named.get(_shown_name(module), 0) + 1
    listed = "; ".join(f"{', '.join(_counted(names))}: {why}" for why, names in reasons.items())
    trainable = [m for m in kept if not m.refusal]
    excluding = _excluding(refused, trainable)
    narrower = _narrowing(trainable, [m for m in modules if m.refusal])
    fix = _fix(loc, exclude, excluding, narrower, modules)
    msg = f"{what} on {architecture} selects layers LoRA cannot train: {listed}"
    return FieldError(loc, msg, fix)


def _fix(
    loc: str,
    exclude: list[str],
    excluding: list[str] | None,
    narrower: list[str] | None,
    modules: list[Module],
) -> str:
    """The shorter fix of the two that validate: excluding, or targeting only what trains."""
    if excluding is not None and (narrower is None or len(excluding) <= len(narrower)):
        return f"set peft.exclude_modules: {_names([*exclude, *excluding])}"
    if narrower is not None:
        unset = " and peft.match_all_linear: false" if loc == "peft.match_all_linear" else ""
        return f"set peft.target_modules: {narrower}{unset}"
    trainable = _names(m.layer_name for m in modules if m.linear and not m.refusal)
    return f"target the layers LoRA can train: {', '.join(trainable)}"


def _shown_name(module: Module) -> str:
    return module.layer_name or "the decoder layers themselves"


def _counted(names: dict[str, int]) -> list[str]:
    return [f"{name} ({count} layers)" if count > 1 else name for name, count in names.items()]


def _excluding(refused: list[Module], trainable: list[Module]) -> list[str] | None:
    """Exclusions for the `refused` modules: each one's own pattern, or, where that would
    exclude a module that trains too, the pattern with every index below the layer a
    wildcard (a Zamba2 adapter list as a whole); None when nothing would be left to train."""
    patterns: list[str] = []
    form: PeftTargets = []
    for module in refused:
        if patterns and selects(form, module.name):
            continue  # an earlier pattern covers it
        pattern = _pattern(module)
        if _selects_any([pattern], trainable):
            pattern = re.sub(r"\.\d+(?=\.|$)", ".*", pattern)
        patterns.append(pattern)
        form = lora_targets(patterns) or []
    return patterns if any(not selects(form, m.name) for m in trainable) else None


def _narrowing(trainable: list[Module], refused: list[Module]) -> list[str] | None:
    """Targets for the `trainable` modules whose patterns select none of `refused`."""
    patterns = [p for p in _names(_pattern(m) for m in trainable) if not _selects_any([p], refused)]
    return patterns or None


def _selects_any(patterns: list[str], modules: list[Module]) -> bool:
    form = lora_targets(patterns) or []
    return any(selects(form, m.name) for m in modules)


def _pattern(module: Module) -> str:
    below = module.layer_name
    if below == module.name:  # outside the layers: its own name, matched whole
        return module.name
    if not below:  # a layer itself: `model.layers.[0-9][0-9]` for two-digit indices
        head, _, index = module.name.rpartition(".")
        return f"{head}.{'[0-9]' * len(index)}"
    return f"*.{below}"


def _names(names: Iterable[str]) -> list[str]:
    """Distinct names in first-seen order."""
    return list(dict.fromkeys(names))
