"""Model-loader keywords: which a loader target takes besides its own, whatever the config.

The model loaders (`tuneyard.models.AutoModelForCausalLM.from_pretrained` / `from_config`
and their AutoModel aliases) and `transformers.AutoConfig.from_pretrained` (under
`model.config`) pass every keyword their spec does not name (`TargetSpec.params`) on as a
config override: the native class sets it on the config, and the Hugging Face class gets it
through transformers' `from_pretrained`, which first takes its own loader options out of
the same keywords. So each keyword outside `params` must be, in this order:

- not one of `LOADER_OPTIONS`, transformers' own loader options: files and folders
  (`cache_dir`, `subfolder`, `offload_folder`, `gguf_file`), hub downloads and credentials
  (`revision`, `token`, `proxies`, ...), weights that unpickle (`weights_only`, `from_tf`),
  device placement (`device_map`, `max_memory`, ...), quantization, adapters, hub kernels;
- a plain identifier (a letter, then letters, digits and underscores, at most 64): the
  name a config attribute can have, never a private one;
- where the config is readable at submit, one of its attributes
  (`jobs.recipe.model.overrides`); where it is not (a hub model the API has not cached),
  it is accepted with a warning and the loader refuses a name the config lacks.

The first two hold whether or not the config is readable. No path-valued loader option is
accepted: weights and config are read only from `pretrained_model_name_or_path` or
`config`, which the data roots confine. `use_safetensors` is the one loader option a
`from_pretrained` target takes (`weight_format_errors`): a boolean, with `force_hf: true`
(the native loader reads safetensors only and takes no such keyword), and `false` (pickled
`.bin` weights) only where the operator allows pickle weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.targets.spec import TargetSpec
from jobs.recipe.targets.table import TARGETS

_FILES = (
    "reads or writes files that the data roots do not confine",
    "remove it: the model is read from pretrained_model_name_or_path (or config), inside "
    "the data roots",
)
_HUB = (
    "downloads from or authenticates to the Hugging Face hub; hub models are read from the "
    "server's cache only",
    "remove it: cache the model (hf download) or give a local directory",
)
_PICKLE = (
    "loads weights through pickle, which can run code",
    "remove it: weights load from safetensors",
)
_PLACEMENT = (
    "places the model's weights (devices, CPU memory or disk); the trainer places them itself",
    "remove it: the distributed section decides how the model spreads over the job's devices",
)
_QUANTIZED = (
    "loads quantized weights or hub kernels, which tuneyard's loader does not run",
    "remove it; a quantized checkpoint's own quantization_config comes from its config.json",
)
_REMOTE = (
    "decides whether the model's own Python runs, which is a grant, not a keyword",
    "remove it; model.trust_remote_code asks for that grant",
)
_LOADING = (
    "changes how transformers loads or returns the model; tuneyard's loader does not take it",
    "remove it",
)
_GROUPS: dict[tuple[str, str], tuple[str, ...]] = {
    _FILES: (
        "cache_dir",
        "subfolder",
        "offload_folder",
        "gguf_file",
        "config",
        "adapter_kwargs",
        "adapter_name",
        "generation_config",
    ),
    _HUB: (
        "revision",
        "token",
        "use_auth_token",
        "proxies",
        "mirror",
        "force_download",
        "resume_download",
        "local_files_only",
        "_commit_hash",
    ),
    _PICKLE: ("weights_only", "from_tf", "from_flax"),
    _PLACEMENT: (
        "device_map",
        "max_memory",
        "offload_state_dict",
        "offload_buffers",
        "low_cpu_mem_usage",
        "device_mesh",
        "tp_plan",
        "tp_size",
        "distributed_config",
    ),
    _QUANTIZED: ("quantization_config", "use_kernels", "kernel_config", "allow_all_kernels"),
    _REMOTE: ("trust_remote_code", "code_revision", "auto_map"),
    _LOADING: (
        "state_dict",
        "variant",
        "key_mapping",
        "ignore_mismatched_sizes",
        "output_loading_info",
        "return_unused_kwargs",
        "fusion_config",
        "disable_mmap",
        "experts_implementation",
        "tqdm_class",
        "_from_auto",
        "_from_pipeline",
        "_fast_init",
    ),
}
# transformers' loader options, each with (why it is refused, the fix).
LOADER_OPTIONS: dict[str, tuple[str, str]] = {
    key: reason for reason, keys in _GROUPS.items() for key in keys
}
LOADER_OPTIONS["use_safetensors"] = (
    "chooses the weight file format, which only a from_pretrained load reads",
    "remove it",
)
LOADER_OPTIONS["pretrained_model_name_or_path"] = (
    "names weights to load, which from_config does not take (it builds a new model)",
    "load the weights with from_pretrained, or give the directory as config",
)
OVERRIDE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")

PICKLE_FIX = (
    "remove use_safetensors (weights load from safetensors), or have pickled .bin weights "
    "allowed: the operator sets TUNEYARD_ALLOW_PICKLE_WEIGHTS=1"
)


def is_override_name(key: object) -> bool:
    """Whether a keyword outside a loader's `params` may be a config attribute override."""
    return isinstance(key, str) and key not in LOADER_OPTIONS and bool(OVERRIDE_NAME.fullmatch(key))


def override_keyword_errors(
    spec: TargetSpec, kwargs: Mapping[str, Any], loc: str
) -> list[FieldError]:
    """One error per keyword of a loader target that is neither its own nor an override."""
    if not spec.overrides:
        return []
    own = (spec.params or frozenset()) | spec.injected | set(spec.nested)
    return [
        _refusal(spec, key, value, f"{loc}.{key}")
        for key, value in kwargs.items()
        if key not in own and not is_override_name(key)
    ]


def _refusal(spec: TargetSpec, key: object, value: Any, loc: str) -> FieldError:
    if key in LOADER_OPTIONS:
        why, fix = LOADER_OPTIONS[str(key)]
        if key == "device_map" and _places_on_disk(value):
            why = "offloads weights to disk, into a folder that the data roots do not confine"
        return FieldError(
            loc, f"{shown(key)} is a model-loader option tuneyard refuses: it {why}", fix
        )
    msg = (
        f"{shown(key)} is not a keyword of {spec.name} nor a config attribute name (a letter, "
        "then letters, digits and underscores)"
    )
    return FieldError(loc, msg, "remove it, or name an attribute of the model's config.json")


def _places_on_disk(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_places_on_disk(item) for item in value.values())
    return isinstance(value, str) and value.strip().lower() == "disk"


def weight_format_errors(model: Mapping[str, Any], allow_pickle_weights: bool) -> list[FieldError]:
    """`model.use_safetensors` on a loader that takes it: a boolean, on the Hugging Face
    class (`force_hf: true`), and `false` only where the operator allows pickle weights."""
    target = model.get("_target_")
    spec = TARGETS.get(target) if isinstance(target, str) else None
    if spec is None or "use_safetensors" not in (spec.params or ()):
        return []
    if "use_safetensors" not in model:
        return []
    value, loc = model["use_safetensors"], "model.use_safetensors"
    if not isinstance(value, bool):
        return [FieldError(loc, "must be true or false", "set true, or remove it")]
    errors = []
    if value is False and not allow_pickle_weights:
        msg = "loads pickled .bin weights, which can run code, and this server does not allow it"
        errors.append(FieldError(loc, msg, PICKLE_FIX))
    if model.get("force_hf") is not True:
        msg = "is read by the Hugging Face class only: tuneyard's native loader reads safetensors"
        errors.append(FieldError(loc, msg, "set model.force_hf: true, or remove it"))
    return errors
