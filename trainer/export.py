"""`python -m trainer.export --checkpoint STEP_DIR --out STAGING --kind K --dtype D`: one
export of a published checkpoint, as the worker runs it (a subprocess: the worker never
imports torch).

`merged` folds a LoRA adapter into its base (`trainer.checkpoint.merge_lora`) and writes
what `transformers.AutoModelForCausalLM.from_pretrained` loads unchanged: safetensors
shards (`model.safetensors.index.json` when there are several;
`TUNEYARD_EXPORT_MAX_SHARD_BYTES` sizes them, 2 GiB by default), the base's `config.json`
(its dtype set to the export's) and `generation_config.json`, and the tokenizer the run
saved. `adapter` copies the PEFT adapter directory with its tensors cast; `full` rewrites a
full fine-tune's consolidated weights the same way as `merged`, without an adapter. Tensors
stream one at a time (peak memory: one base tensor and its delta). Everything lands in
`--out` and is fsynced, `export.json` last; the worker renames the directory into place.
Exit codes are `jobs.recipe.exit_codes`': an adapter that cannot be merged exactly is
`UNSUPPORTED`, an unreadable checkpoint `CHECKPOINT_ERROR` (neither is retried), anything
else `CRASH`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from jobs.recipe.exit_codes import ExitCode
from models.common.config import ModelLoadError, resolve_model_dir
from models.common.safetensors_io import (
    CheckpointError,
    SafetensorsFileWriter,
    SafetensorsReader,
    TensorEntry,
    plan_shards,
    read_tensors,
    shard_file_names,
    write_index,
)
from trainer.checkpoint.merge_lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterWeights,
    MergeRefused,
    merged_weight,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KINDS = ("merged", "adapter", "full")
MANIFEST = "export.json"
MAX_SHARD_ENV = "TUNEYARD_EXPORT_MAX_SHARD_BYTES"
BASE_MODEL_DIR = "base_model"  # where a from_config LoRA run saved its frozen base
_WEIGHT_FILES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")
_NOT_COPIED = {ADAPTER_CONFIG, "README.md", MANIFEST}


def base_dir_of(step_dir: Path, adapter_config: dict[str, Any]) -> Path:
    """The base an adapter was trained on: the directory its config names, the checkpoint's
    own `base_model/` (a from_config run), or a hub id already in the cache."""
    named = str(adapter_config.get("base_model_name_or_path") or "")
    if named and Path(named).is_dir():
        return Path(named)
    if (step_dir / BASE_MODEL_DIR).is_dir():
        return step_dir / BASE_MODEL_DIR
    try:
        return resolve_model_dir(named)
    except ModelLoadError as exc:
        raise CheckpointError(f"the adapter's base model {named!r}: {exc}") from None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_weights(
    out: Path, source: Path, dtype: torch.dtype, adapter: AdapterWeights | None
) -> list[str]:
    """Every tensor of the safetensors checkpoint `source`, merged with `adapter` when given,
    cast to `dtype`, written as shards (and an index) in `out`; the file names."""
    max_bytes = int(os.environ.get(MAX_SHARD_ENV) or 2 * 2**30)
    with SafetensorsReader(source) as reader:
        specs = reader.specs
        if adapter is not None and (unused := adapter.unused(set(specs))):
            raise MergeRefused(f"the adapter names tensors the base does not have: {unused[:5]}")
        entries = [
            TensorEntry(n, dtype if s.dtype.is_floating_point else s.dtype, s.shape)
            for n, s in specs.items()
        ]
        shards = plan_shards(entries, max_bytes)
        names = shard_file_names(len(shards))
        for file_name, shard in zip(names, shards, strict=True):
            with SafetensorsFileWriter(out / file_name, shard) as writer:
                for entry in shard:
                    writer.write(entry.name, _tensor(reader, entry, adapter))
        write_index(out, shards)
    return names


def _tensor(reader: SafetensorsReader, entry: TensorEntry, adapter: AdapterWeights | None) -> Any:
    spec = reader.specs[entry.name]
    if adapter is not None and entry.name in adapter.replacements:
        return adapter.replacements[entry.name].to(entry.dtype)
    tensor = torch.empty(spec.shape, dtype=spec.dtype)
    reader.read_into(entry.name, tensor)
    if adapter is not None and entry.name in adapter.deltas:
        tensor = merged_weight(tensor, adapter.deltas[entry.name])
    return tensor.to(entry.dtype)


def copy_side_files(source: Path, out: Path, skip: set[str] | None = None) -> None:
    """Config, tokenizer and template files of `source` (no weights) into `out`."""
    for path in sorted(source.iterdir()):
        name = path.name
        if not path.is_file() or name.endswith(_WEIGHT_FILES) or name in (skip or set()):
            continue
        if name in _NOT_COPIED or (out / name).exists():
            continue
        shutil.copyfile(path, out / name)


def set_config_dtype(out: Path, dtype_name: str) -> None:
    """The exported `config.json` states the dtype its weights are stored in."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    if "dtype" in config:
        config["dtype"] = dtype_name
    config["torch_dtype"] = dtype_name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def export_checkpoint(step_dir: Path, out: Path, kind: str, dtype_name: str) -> dict[str, Any]:
    """Write the export of `step_dir` into `out` (created); its manifest."""
    dtype, model_dir = DTYPES[dtype_name], step_dir / "model"
    out.mkdir(parents=True, exist_ok=True)
    is_adapter = (model_dir / ADAPTER_CONFIG).is_file()
    if kind == "adapter" and not is_adapter:
        raise MergeRefused("this checkpoint holds no LoRA adapter: export it with kind full")
    manifest: dict[str, Any] = {"kind": kind, "dtype": dtype_name, "source": str(step_dir)}
    if kind == "adapter":
        _write_adapter(model_dir, out, dtype)
    elif is_adapter:  # merged, or `full` asked of a LoRA run: the merged model is its full form
        config = json.loads((model_dir / ADAPTER_CONFIG).read_text())
        base = base_dir_of(step_dir, config)
        adapter = AdapterWeights.read(model_dir)
        manifest |= {"kind": "merged", "base_model": str(base)}
        manifest["files"] = write_weights(out, base, dtype, adapter)
        copy_side_files(model_dir, out)  # the run's tokenizer and chat template first
        copy_side_files(base, out)  # then the base's config and generation config
        set_config_dtype(out, dtype_name)
    else:
        manifest["files"] = write_weights(out, model_dir, dtype, None)
        copy_side_files(model_dir, out)
        set_config_dtype(out, dtype_name)
    return _finish(out, manifest)


def _write_adapter(model_dir: Path, out: Path, dtype: torch.dtype) -> None:
    tensors = [(n, t.to(dtype)) for n, t in read_tensors(model_dir / ADAPTER_WEIGHTS)]
    entries = [TensorEntry.of(n, t) for n, t in tensors]
    with SafetensorsFileWriter(out / ADAPTER_WEIGHTS, entries) as writer:
        for name, tensor in tensors:
            writer.write(name, tensor)
    shutil.copyfile(model_dir / ADAPTER_CONFIG, out / ADAPTER_CONFIG)
    copy_side_files(model_dir, out)


def _finish(out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """fsync every file, then write the manifest last (and fsync it and the directory)."""
    for path in out.iterdir():
        if path.is_file():
            _fsync(path)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _fsync(out / MANIFEST)
    _fsync(out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.export")
    parser.add_argument("--checkpoint", required=True, type=Path, help="a step_<N> directory")
    parser.add_argument("--out", required=True, type=Path, help="the staging directory")
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--dtype", required=True, choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))
    try:
        manifest = export_checkpoint(args.checkpoint, args.out, args.kind, args.dtype)
    except MergeRefused as exc:
        print(f"export refused: {exc}", file=sys.stderr)
        return ExitCode.UNSUPPORTED
    except (CheckpointError, FileNotFoundError, json.JSONDecodeError, KeyError) as exc:
        print(f"export failed: unreadable checkpoint {args.checkpoint}: {exc}", file=sys.stderr)
        return ExitCode.CHECKPOINT_ERROR
    print(json.dumps({"exported": manifest}), flush=True)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
