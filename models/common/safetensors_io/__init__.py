"""The one safetensors reader and writer: checked headers, streamed tensors, HF shards.

Everything is imported from here. `format` owns the dtype table, tensor sizes, the header
written from shapes alone and the header checked against the file; `writer` streams one
tensor at a time into a declared file; `reader` reads checked tensors straight into their
destination, nothing memory-mapped; `shards` owns shard planning, transformers' file names
and `model.safetensors.index.json`.
"""

from models.common.safetensors_io.format import (
    CODES,
    DEFAULT_METADATA,
    DTYPES,
    MAX_HEADER_BYTES,
    CheckpointError,
    TensorEntry,
    TensorSpec,
    header_bytes,
    read_specs,
)
from models.common.safetensors_io.reader import (
    SafetensorsReader,
    directory_specs,
    iter_safetensors,
    read_into,
    read_tensors,
    reads_in_place,
)
from models.common.safetensors_io.shards import (
    INDEX_FILE,
    SINGLE_FILE,
    checkpoint_files,
    plan_shards,
    shard_file_names,
    write_index,
)
from models.common.safetensors_io.writer import SafetensorsFileWriter, save_safetensors, write_file

__all__ = [
    "CODES",
    "DEFAULT_METADATA",
    "DTYPES",
    "INDEX_FILE",
    "MAX_HEADER_BYTES",
    "SINGLE_FILE",
    "CheckpointError",
    "SafetensorsFileWriter",
    "SafetensorsReader",
    "TensorEntry",
    "TensorSpec",
    "checkpoint_files",
    "directory_specs",
    "header_bytes",
    "iter_safetensors",
    "plan_shards",
    "read_into",
    "read_specs",
    "read_tensors",
    "reads_in_place",
    "save_safetensors",
    "shard_file_names",
    "write_file",
    "write_index",
]
