"""Model loading and the native model registry.

`models.registry` is torch-free (the API and validation import it); everything else here
needs torch and is imported lazily, so `import models.registry` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AutoModelForCausalLM"]


def __getattr__(name: str) -> Any:
    if name == "AutoModelForCausalLM":
        from models.auto import AutoModelForCausalLM

        return AutoModelForCausalLM
    raise AttributeError(f"module 'models' has no attribute {name!r}")
