"""AutoModel's pretraining and benchmark datasets (mock, nanoGPT token shards, Megatron
indexed files): their specs, aliases and keyword synonyms, merged into the allowlist by
`jobs.recipe.targets.table`.

File keywords (`file_pattern`, `paths`, `index_mapping_dir`) are `paths`: every string in
them (a blend's weights skipped) is checked against the data roots. The value models type
the rest and check shapes the trainer would otherwise refuse late: a blend that does not
alternate weight and prefix, a glob inside a list (only AutoModel's single-string form
globs), a split string that is not up to three weights, a `splits_to_build` naming more
than the one split a dataset section serves, `align_to_bos` without `bos_token`.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from jobs.recipe.errors import shown
from jobs.recipe.load import limits
from jobs.recipe.targets.spec import TargetSpec, spec

_LLM = "nemo_automodel.components.datasets.llm"
_GLOB = frozenset("*?[")
PositiveInt = Annotated[int, Field(gt=0)]
SplitName = Literal["train", "validation", "test"]


def _is_weight(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return math.isfinite(value) and value >= 0
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return False
        return math.isfinite(number) and number >= 0
    return False


def _blend_errors(value: Any) -> str | None:
    """Why a Megatron `paths` list is malformed, or None."""
    if not value:
        return "is empty; give a prefix, a list of prefixes or [weight, prefix, ...]"
    if not _is_weight(value[0]):
        bad = [i for i, item in enumerate(value) if not isinstance(item, str) or not item]
        if bad:
            return f"item {bad[0]} is not a prefix string (a blend starts with its weight)"
        globbed = [i for i, item in enumerate(value) if _GLOB & set(item)]
        if globbed:
            return f"item {globbed[0]} is a glob; only a single string may glob"
        return None
    weights, prefixes = value[0::2], value[1::2]
    if len(weights) != len(prefixes):
        return "a blend alternates weight and prefix: [30, prefix_a, 70, prefix_b]"
    for i, weight in enumerate(weights):
        if not _is_weight(weight):
            return f"item {2 * i} should be a weight >= 0 (blends alternate weight, prefix)"
    for i, prefix in enumerate(prefixes):
        if not isinstance(prefix, str) or not prefix or _GLOB & set(prefix):
            return f"item {2 * i + 1} should be a prefix string, not {shown(prefix)}"
    if sum(float(w) for w in weights) <= 0:
        return "the blend weights sum to 0"
    return None


Blend = str | list[str | float | int]


class MegatronValues(BaseModel):
    """Types of MegatronPretraining's keywords (AutoModel's names and defaults)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    paths: Blend | dict[SplitName, Blend]
    micro_batch_size: PositiveInt = 4
    global_batch_size: PositiveInt = 8
    create_attention_mask: bool = False
    split: str | None = "900,50,50"
    index_mapping_dir: str | None = None
    num_dataset_builder_threads: PositiveInt = 1
    num_train_samples: PositiveInt | None = None
    num_val_samples: PositiveInt | None = None
    num_test_samples: PositiveInt | None = None
    trainer_max_steps: Annotated[int, Field(ge=-1)] | None = None
    trainer_val_check_interval: PositiveInt = 1000
    trainer_limit_val_batches: Annotated[float, Field(ge=0)] = 1
    trainer_limit_test_batches: Annotated[float, Field(ge=0)] = 1
    mmap_bin_files: bool = True
    dataloader_type: Literal["single", "cyclic", "batch"] | None = "single"
    splits_to_build: SplitName | list[SplitName] | None = None

    @field_validator("paths")
    @classmethod
    def _paths_shape(cls, value: Any) -> Any:
        blends = value.values() if isinstance(value, dict) else [value]
        for blend in blends:
            why = _blend_errors(blend) if isinstance(blend, list) else None
            if isinstance(blend, str) and not blend:
                why = "is an empty prefix"
            if why:
                raise ValueError(why)
        return value

    @field_validator("split")
    @classmethod
    def _split_shape(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = re.findall(r"[.0-9]+", value)
        if not parts or len(parts) > 3 or re.sub(r"[.0-9,\s]", "", value):
            raise ValueError("must be up to 3 comma-separated weights, e.g. '99,1,0'")
        if sum(float(p) for p in parts) <= 0:
            raise ValueError("the split weights sum to 0; e.g. '99,1,0'")
        return value

    @field_validator("splits_to_build")
    @classmethod
    def _one_split(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("a dataset section serves one split: name train, validation or test")
        return value


class NanogptValues(BaseModel):
    """Types of NanogptDataset's keywords."""

    model_config = ConfigDict(strict=True, extra="ignore")

    file_pattern: str | Annotated[list[str], Field(min_length=1)]
    bos_token: Annotated[int, Field(ge=0)] | None = None
    shuffle_files: bool = False
    align_to_bos: bool = False
    drop_last: bool = True
    infinite: bool = False

    @field_validator("file_pattern")
    @classmethod
    def _explicit_list(cls, value: Any) -> Any:
        if isinstance(value, list) and any(_GLOB & set(name) or not name for name in value):
            raise ValueError("a list names shard files; only a single string may glob")
        return value

    @field_validator("align_to_bos")
    @classmethod
    def _needs_bos(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("bos_token") is None:
            raise ValueError("align_to_bos: true needs bos_token (the BOS token id)")
        return value


class MockValues(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    batch_size: PositiveInt = 1
    exclude_token_ids: list[Annotated[int, Field(ge=0)]] | None = None


class MockSentenceValues(BaseModel):
    """AutoModel's `build_unpacked_dataset` sizes (`trainer.data.mock.MockSentenceDataset`)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    num_sentences: Annotated[int, Field(gt=0, le=limits.MAX_DATASET_SAMPLES)] = 10
    mean_len: Annotated[float, Field(gt=0, le=limits.MAX_SEQ_LENGTH)] = 20.0
    std_len: Annotated[float, Field(ge=0, le=limits.MAX_SEQ_LENGTH)] = 6.0
    max_sentence_len: Annotated[int, Field(gt=0, le=limits.MAX_SEQ_LENGTH)] = 64


_MEGATRON_PARAMS = (*MegatronValues.model_fields, "seq_length", "seed")

SPECS: list[TargetSpec] = [
    spec(
        "tuneyard.datasets.MockIterableDataset",
        "trainer.data.mock:MockIterableDataset",
        "dataset",
        ("vocab_size", "seq_length", "num_samples", "batch_size", "seed", "exclude_token_ids"),
        values=MockValues,
    ),
    spec(
        "tuneyard.datasets.MockSentenceDataset",
        "trainer.data.mock:MockSentenceDataset",
        "dataset",
        (*MockSentenceValues.model_fields, "vocab_size", "seed"),
        values=MockSentenceValues,
    ),
    spec(
        "tuneyard.datasets.NanogptDataset",
        "trainer.data.nanogpt:NanogptDataset",
        "dataset",
        ("file_pattern", "seq_length", *NanogptValues.model_fields),
        required=("file_pattern", "seq_length"),
        paths=("file_pattern",),
        path_forms={"file_pattern": "glob"},
        ignored={
            "shuffle_files": "tuneyard's sampler orders every sample (dataloader.shuffle)",
            "drop_last": "a partial window is always dropped",
            "infinite": "epochs come from step_scheduler",
        },
        values=NanogptValues,
    ),
    spec(
        "tuneyard.datasets.MegatronPretraining",
        "trainer.data.megatron:MegatronPretraining",
        "dataset",
        _MEGATRON_PARAMS,
        injected=("tokenizer",),
        required=("paths",),
        paths=("paths", "index_mapping_dir"),
        path_forms={"paths": "megatron_prefix"},
        ignored={
            "create_attention_mask": "the collator builds the attention mask",
            "mmap_bin_files": "the .bin files are always memory-mapped",
            "num_dataset_builder_threads": "the sample index is built with numpy",
            "dataloader_type": "tuneyard's resumable sampler decides the order",
            "trainer_limit_test_batches": "tuneyard runs no test loop",
            "micro_batch_size": "batches come from dataloader.batch_size",
        },
        values=MegatronValues,
    ),
]

ALIASES: dict[str, str] = {
    f"{_LLM}.mock_iterable_dataset.MockIterableDataset": "tuneyard.datasets.MockIterableDataset",
    f"{_LLM}.mock.build_unpacked_dataset": "tuneyard.datasets.MockSentenceDataset",
    f"{_LLM}.nanogpt_dataset.NanogptDataset": "tuneyard.datasets.NanogptDataset",
    f"{_LLM}.NanogptDataset": "tuneyard.datasets.NanogptDataset",
    f"{_LLM}.megatron_dataset.MegatronPretraining": "tuneyard.datasets.MegatronPretraining",
}

SYNONYMS: dict[str, dict[str, str]] = {
    "tuneyard.datasets.MockIterableDataset": {"seq_len": "seq_length"},
    "tuneyard.datasets.NanogptDataset": {"seq_len": "seq_length"},
}
