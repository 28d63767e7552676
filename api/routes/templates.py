"""`/v1/templates`: the example recipes shipped in the repository's `examples/` folder, for
the submit page's "start from a template". Each is served as written (comments included),
titled by the first line of its opening comment. A deployment without the folder answers
an empty list.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter

from api.deps import Reader
from api.routes.jobs import AUTH_ERRORS
from api.schemas import RecipeTemplate, RecipeTemplates

router = APIRouter(prefix="/v1", tags=["templates"])

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
MAX_TEMPLATE_BYTES = 256 * 1024  # an example is a page of YAML; anything larger is not one


@lru_cache(maxsize=1)
def load_templates(root: Path = EXAMPLES_DIR) -> tuple[RecipeTemplate, ...]:
    """Every `*.yaml` under `root`, sorted by path (read once: the files ship with the code)."""
    if not root.is_dir():
        return ()
    found = []
    for path in sorted(root.rglob("*.yaml")):
        if not path.is_file() or path.stat().st_size > MAX_TEMPLATE_BYTES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        name = path.relative_to(root).as_posix()
        found.append(RecipeTemplate(name=name, title=_title(text) or name, recipe_yaml=text))
    return tuple(found)


def _title(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            break
    return ""


@router.get(
    "/templates",
    response_model=RecipeTemplates,
    summary="Example recipes",
    responses={**AUTH_ERRORS},
)
def list_templates(principal: Reader) -> RecipeTemplates:
    """The example recipes a new job can start from."""
    return RecipeTemplates(data=list(load_templates()))
