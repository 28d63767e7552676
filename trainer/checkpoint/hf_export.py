"""A checkpoint's `model/` directory as the Hugging Face ecosystem loads it, as is.

A full fine-tune writes consolidated weights, `config.json`, `generation_config.json` (the
base model's own when its directory has one, else derived from the model config) and the
tokenizer with its chat template, so `AutoModelForCausalLM`, `AutoTokenizer` and
`GenerationConfig` load `model/` offline. A LoRA run writes the adapter with the tokenizer
and an adapter config naming its base model, so `AutoPeftModelForCausalLM` loads
`model/`: the base is the recipe's `pretrained_model_name_or_path` (a local directory as an
absolute path, a hub id as given). A model built from a config has no such base anywhere
but in this run, so its frozen weights are saved beside the adapter as `base_model/` and
the adapter config names that directory's published path. `model/README.md` says which
base the adapter needs and how to load it. `snapshot_model_dir` is the asynchronous
save's form: gather now, write later.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.recipe.typed import TargetCall
from trainer.checkpoint import consolidate, stage_export

if TYPE_CHECKING:
    from trainer.setup import TrainingRun

BASE_MODEL_DIR = "base_model"


def base_model_reference(model: TargetCall) -> str | None:
    """The base model as `from_pretrained` elsewhere finds it; None for a from_config model."""
    value = model.text("pretrained_model_name_or_path")
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path.resolve()) if path.is_dir() else value


def base_generation_config(model: TargetCall) -> Any:
    """The base model directory's `generation_config.json`, or None when it has none."""
    base = base_model_reference(model)
    if base is None:
        return None
    from transformers import GenerationConfig

    from models.common.config import ModelLoadError, resolve_model_dir

    try:
        directory = resolve_model_dir(base)
    except ModelLoadError:
        return None
    if not (directory / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(directory, local_files_only=True)


def save_model_dir(run: TrainingRun, staging: Path) -> None:
    """Write `model/` (and `base_model/` for a from_config LoRA run) under `staging`."""
    out_dir = staging / "model"
    if run.is_peft:
        _save_adapter(run, staging)
    elif run.pipeline is not None:  # every stage's parameters into one directory
        generation = base_generation_config(run.recipe.model)
        stage_export.save_pipeline_model(
            run.model, out_dir, run.topology, run.env.is_rank0, generation_config=generation
        )
    else:
        generation = base_generation_config(run.recipe.model)
        consolidate.save_consolidated_model(
            run.model, out_dir, run.env.is_rank0, generation_config=generation
        )
    _save_tokenizer(run.tokenizer, out_dir, run.env.is_rank0)


def snapshot_model_dir(run: TrainingRun, staging: Path) -> Callable[[], None] | None:
    """For an asynchronous save: gather `model/` now, return what writes it (rank 0).

    A full fine-tune's consolidated weights are gathered into CPU memory and written by
    the returned function, on the background thread. A LoRA adapter is small: it, and
    the tokenizer (which the step loop's data may still be using), are written here.
    """
    if run.is_peft:
        save_model_dir(run, staging)
        return None
    snapshot = consolidate.snapshot_consolidated_model(
        run.model, run.env.is_rank0, generation_config=base_generation_config(run.recipe.model)
    )
    _save_tokenizer(run.tokenizer, staging / "model", run.env.is_rank0)
    if snapshot is None:
        return None
    return functools.partial(consolidate.write_consolidated_snapshot, snapshot, staging / "model")


def _save_adapter(run: TrainingRun, staging: Path) -> None:
    is_rank0, base = run.env.is_rank0, base_model_reference(run.recipe.model)
    saved_here = base is None
    staged = run.pipeline is not None  # each pp rank holds only its stages' tensors
    if saved_here:
        base_dir = staging / BASE_MODEL_DIR
        if staged:
            stage_export.save_pipeline_lora_base(run.model, base_dir, run.topology, is_rank0)
        else:
            consolidate.save_lora_base_model(run.model, base_dir, is_rank0)
        _save_tokenizer(run.tokenizer, base_dir, is_rank0)
        base = str(run.checkpoints.final_dir(run.step) / BASE_MODEL_DIR)
    out_dir = staging / "model"
    if staged:
        stage_export.save_pipeline_adapter(run.model, out_dir, run.topology, is_rank0, base)
    else:
        consolidate.save_lora_adapter(run.model, out_dir, is_rank0, base_model=base)
    if is_rank0:
        write_adapter_readme(staging / "model", str(base), saved_here)


def _save_tokenizer(tokenizer: Any, out_dir: Path, is_rank0: bool) -> None:
    # transformers writes the chat template beside it (chat_template.jinja)
    if is_rank0 and tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


def write_adapter_readme(out_dir: Path, base: str, saved_here: bool) -> None:
    """A short card: the base the adapter needs, and the two ways to load it."""
    origin = (
        f"The model was built from a config, so its frozen base weights are saved beside "
        f"this adapter in `../{BASE_MODEL_DIR}/`; `adapter_config.json` names that "
        f"directory by its absolute path. If you move the checkpoint, set "
        f"`base_model_name_or_path` to the new `{BASE_MODEL_DIR}/` path."
        if saved_here
        else "`adapter_config.json` names it as `base_model_name_or_path`; it must be "
        "readable where the adapter is loaded (a local directory, or a hub id in the cache)."
    )
    text = (
        "# LoRA adapter\n\n"
        f"Base model: `{base}`\n\n{origin}\n\n"
        "```python\n"
        "from peft import AutoPeftModelForCausalLM\n"
        "from transformers import AutoTokenizer\n\n"
        'model = AutoPeftModelForCausalLM.from_pretrained("<this directory>")\n'
        'tokenizer = AutoTokenizer.from_pretrained("<this directory>")\n'
        "```\n"
    )
    (out_dir / "README.md").write_text(text)
