"""Optional packages a job needs, and where they must be importable.

A recipe that names a callable from an optional package (Transformer Engine's `FusedAdam`,
`flashoptim`, `dion`), turns on a tracker (`wandb:`, `mlflow:`), quantizes its base for
QLoRA (`quantization:`, bitsandbytes) or asks for
`attn_implementation: flash_attention_2` (the flash-attn package) *requires* that package:
`required_packages` lists their import names for the plan (`plan.requires`). The worker
advertises the packages it can import when it heartbeats (`worker_packages`); a worker
claims only jobs whose requirements it meets, and the API refuses a job when live workers of
its queue exist and none has a required package (`requirement_errors`), or accepts it with a
warning when no worker of that queue is live to ask. `tuneyard validate`, without a server,
warns when the local interpreter lacks one (`local_requirement_warnings`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

from jobs.recipe.errors import FieldError
from jobs.recipe.sections.trackers import TRACKER_PACKAGES
from jobs.recipe.targets.allowlist import target_mappings
from jobs.recipe.targets.table import TARGETS

# Import name -> how an operator installs it on a worker.
INSTALL = {
    "transformer_engine": "pip install --no-build-isolation 'transformer_engine[pytorch]'",
    "flashoptim": "pip install flashoptim",
    "dion": "pip install git+https://github.com/microsoft/dion.git",
    "liger_kernel": "pip install liger-kernel",
    "flash_attn": "pip install --no-build-isolation flash-attn",
    "wandb": "pip install 'tuneyard[wandb]'",
    "mlflow": "pip install 'tuneyard[mlflow]'",
    "bitsandbytes": "pip install 'tuneyard[qlora]'",
}
OPTIONAL_PACKAGES = tuple(sorted(INSTALL))
# Packages whose callables run CUDA kernels only: a CPU job naming one is refused at submit
# (Transformer Engine does not even import without a GPU). flash_attn is refused on CPU at
# `attn_implementation` by `jobs.recipe.topology.trainer_support`.
CUDA_ONLY = {"transformer_engine": "Transformer Engine's fused CUDA kernels"}


def requirement_sources(normalized: Mapping[str, Any]) -> dict[str, str]:
    """Each required package and the first field that requires it."""
    found: dict[str, str] = {}
    for name, section in normalized.items():
        for loc, mapping in target_mappings(section, name):
            target = mapping["_target_"]
            spec = TARGETS.get(target) if isinstance(target, str) else None
            for package in sorted(spec.requires if spec else ()):
                found.setdefault(package, f"{loc}._target_")
    for section, package in TRACKER_PACKAGES.items():
        if normalized.get(section) is not None:
            found.setdefault(package, section)
    if normalized.get("quantization") is not None:  # QLoRA's quantized linear layers
        found.setdefault("bitsandbytes", "quantization")
    for section in ("model", "teacher_model"):  # transformers imports flash-attn for it
        model = normalized.get(section)
        if isinstance(model, dict) and model.get("attn_implementation") == "flash_attention_2":
            found.setdefault("flash_attn", f"{section}.attn_implementation")
    return found


def cuda_only_errors(normalized: Mapping[str, Any], accelerator: str) -> list[FieldError]:
    """A CPU job's callables that need CUDA, each an error at its `_target_`."""
    if accelerator == "cuda":
        return []
    errors = []
    for package, loc in sorted(requirement_sources(normalized).items()):
        if package in CUDA_ONLY:
            msg = (
                f"needs {package} ({CUDA_ONLY[package]}), which runs only on CUDA; "
                f"the job's accelerator is {accelerator}"
            )
            fix = "use torch.optim.AdamW (the same update), or submit with resources.accelerator: cuda"
            errors.append(FieldError(loc, msg, fix))
    return errors


def required_packages(normalized: Mapping[str, Any]) -> list[str]:
    return sorted(requirement_sources(normalized))


def importable(package: str) -> bool:
    """Whether this interpreter can import `package`, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def worker_packages(candidates: Iterable[str] = OPTIONAL_PACKAGES) -> list[str]:
    """The optional packages this interpreter has: what a worker advertises."""
    return sorted(p for p in candidates if importable(p))


def missing_packages(required: Iterable[str], available: Iterable[str]) -> list[str]:
    have = set(available)
    return sorted(p for p in required if p not in have)


def _install(package: str) -> str:
    return INSTALL.get(package, f"pip install {package}")


def requirement_errors(
    sources: Mapping[str, str], queue: str, live: list[list[str]]
) -> tuple[list[FieldError], list[FieldError]]:
    """(errors, warnings) for a job's packages against the live workers of its queue.

    `live` holds each live worker's advertised packages. No live worker: a warning (none
    can be asked); live workers and none has a package: an error naming it and the fix.
    """
    errors, warnings = [], []
    for package, loc in sorted(sources.items()):
        if not live:
            msg = (
                f"needs {package}; no worker of queue {queue} is live to confirm it has it "
                f"(install it on the workers: {_install(package)})"
            )
            warnings.append(FieldError(loc, msg))
        elif not any(package in have for have in live):
            msg = f"needs {package}: no worker of queue {queue} has {package}"
            fix = f"install it on a worker of queue {queue} ({_install(package)}) or remove {loc}"
            errors.append(FieldError(loc, msg, fix))
    return errors, warnings


def local_requirement_warnings(sources: Mapping[str, str]) -> list[FieldError]:
    """`tuneyard validate` without a server: what this interpreter could not run."""
    return [
        FieldError(
            loc,
            f"needs {package}, which this interpreter cannot import "
            f"(a worker needs it: {_install(package)})",
        )
        for package, loc in sorted(sources.items())
        if not importable(package)
    ]
