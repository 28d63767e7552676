"""The grants a recipe needs: what only an operator or a project admin can allow.

One grant exists, `remote_code`: `trust_remote_code: true` on the model, a KD teacher model
or the tokenizer runs the model directory's own Python on the workers. The operator allows
it for every project (`TUNEYARD_ALLOW_REMOTE_CODE=1`, `operator_grants`), a project admin
for one project (`PATCH /v1/projects/<name> {"allow_remote_code": true}`).

`required_grants` is the one statement of which fields ask for a grant. Validation records
it in the plan (`plan.trust_remote_code`); a worker asks it again of the stored recipe at
every claim (`jobs.orchestration.claims`), because a grant can be withdrawn while the job
waits in its queue or between its attempts, and `revoked_grant_errors` says which field
lost its grant and what brings it back. It reads a normalized recipe and a stored one
alike: both keep these sections as `{_target_: ..., keyword: value}` mappings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.settings import RecipeSettings

REMOTE_CODE = "remote_code"
# Sections whose `trust_remote_code: true` loads a model directory's own Python.
REMOTE_CODE_SECTIONS = ("model", "teacher_model", "tokenizer")

# How a project gets the grant back (the same two ways validation names when it refuses).
REGRANT = (
    'a project admin sends PATCH /v1/projects/<name> {"allow_remote_code": true}, or the '
    "operator sets TUNEYARD_ALLOW_REMOTE_CODE=1 on the workers"
)


def required_grants(sections: Mapping[str, Any]) -> dict[str, str]:
    """Each grant the recipe needs and the first field that asks for it.

    Any value but an absent or false one counts: a worker that finds a stored recipe it
    cannot read as plainly off refuses rather than runs the model's code.
    """
    found: dict[str, str] = {}
    for name in REMOTE_CODE_SECTIONS:
        section = sections.get(name)
        if isinstance(section, Mapping) and section.get("trust_remote_code") not in (None, False):
            found.setdefault(REMOTE_CODE, f"{name}.trust_remote_code")
    return found


def operator_grants(settings: RecipeSettings) -> frozenset[str]:
    """What the operator's settings allow every project."""
    return frozenset({REMOTE_CODE}) if settings.allow_remote_code else frozenset()


def project_grants(allow_remote_code: bool) -> frozenset[str]:
    """What a project's own grant (its `projects.allow_remote_code` column) allows."""
    return frozenset({REMOTE_CODE}) if allow_remote_code else frozenset()


def unmet_grants(required: Mapping[str, str], held: Iterable[str]) -> dict[str, str]:
    """The grants of `required` (grant -> field) that `held` lacks."""
    have = set(held)
    return {grant: loc for grant, loc in sorted(required.items()) if grant not in have}


def revoked_grant_errors(unmet: Mapping[str, str]) -> list[FieldError]:
    """Why a stored job cannot run any more: per field, the grant it lost and the fix."""
    errors = []
    for grant, loc in sorted(unmet.items()):
        what = "remote-code" if grant == REMOTE_CODE else grant
        msg = (
            f"the project's {what} grant was revoked after submission, and the operator "
            "does not allow it on this worker"
        )
        fix = f"ask an operator to grant it again ({REGRANT}) and resubmit the job, or drop {loc}"
        errors.append(FieldError(loc, msg, fix))
    return errors
