"""AutoModel's instruction and chat datasets (SQuAD aside) and the tokenizer targets: their
specs, aliases and keyword synonyms, merged into the allowlist by `jobs.recipe.targets.table`.

Each dataset takes AutoModel's keyword names (`HellaSwag`: `path_or_dataset`, `split`,
`num_samples_limit`; `ChatDataset` and `ColumnMappedTextInstructionDataset`:
`path_or_dataset_id`, `split`, `seq_length`, ...) and gets the trainer's tokenizer. Path
keywords are checked against the data roots, names (`split`, `name`) are never paths, and a
strict value model types the rest (bools, the column mapping, the padding and truncation
modes, a chat template's text, which a template file becomes at submit), so a wrong type
is refused at submit at its field. `IGNORED` says, per callable, which keywords are
accepted but change nothing here, and why.

The tokenizer callables load local files or the hub cache only; `trust_remote_code` is the
model's grant, supplied by the trainer, so a recipe may not give it.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from jobs.recipe.targets.spec import TargetSpec, spec


def _plain_name(value: str) -> str:
    if any(bad in value for bad in ("/", "\\", "\x00", "..")):
        raise ValueError("a name, not a path: no '/', '\\' or '..'")
    return value


# A column, config or revision name: never a path (the rule splits follow).
Name = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_plain_name)]
Padding = Literal["do_not_pad", "longest", "max_length"] | bool
Truncation = Literal["do_not_truncate", "longest_first", "only_first", "only_second"] | bool


def _inline_template(value: str) -> str:
    if "{{" not in value and "{%" not in value:
        raise ValueError(
            "must be Jinja template text ({{ or {%), or the path of a template file inside "
            "the data roots; leave chat_template out to use the tokenizer's"
        )
    return value


# A Jinja template, as text: a file path has been read at submit by then, inside the data
# roots (`jobs.recipe.sections.chat_template`), so the trainer never opens a file for it.
ChatTemplate = Annotated[
    str, StringConstraints(max_length=200_000), AfterValidator(_inline_template)
]
PositiveInt = Annotated[int, Field(gt=0)]


class _Values(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ColumnMapping(BaseModel):
    """Logical field -> source column: `answer`, and `context` and/or `question`."""

    model_config = ConfigDict(strict=True, extra="forbid")
    context: Name | None = None
    question: Name | None = None
    answer: Name

    @model_validator(mode="after")
    def _has_a_prompt(self) -> ColumnMapping:
        if self.context is None and self.question is None:
            raise ValueError("map context or question (or both) besides answer")
        return self


class HellaSwagValues(_Values):
    num_samples_limit: PositiveInt | None = None
    pad_to_max_length: bool = True


class ChatValues(_Values):
    padding: Padding = "do_not_pad"
    truncation: Truncation = "do_not_truncate"
    start_of_turn_token: str | None = None
    chat_template: ChatTemplate | None = None
    shuffle_seed: int | None = None
    mask_reasoning_content: bool = False


class ColumnMappedValues(_Values):
    column_mapping: ColumnMapping
    answer_only_loss_mask: bool = True
    use_hf_chat_template: bool = False
    padding: Padding = "do_not_pad"
    truncation: Truncation = "do_not_truncate"
    start_of_turn_token: str | None = None


class TokenizerValues(_Values):
    use_fast: bool | None = None
    revision: Name | None = None
    subfolder: Name | None = None
    model_max_length: PositiveInt | None = None
    legacy: bool | None = None
    padding_side: Literal["left", "right"] | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    force_hf: bool | None = None


_PADDING = "the collator pads each batch to its longest sample; pad tokens carry no loss"
_TURN_TOKEN = "assistant turns are found from the chat template, not from a token"
_SPECIALS = "tuneyard's datasets add BOS before the prompt and EOS after each target themselves"
_SIDE = "the collator pads on the right and datasets truncate keeping the target"
IGNORED: dict[str, dict[str, str]] = {
    "tuneyard.datasets.HellaSwag": {"pad_to_max_length": _PADDING},
    "tuneyard.datasets.ChatDataset": {"padding": _PADDING, "start_of_turn_token": _TURN_TOKEN},
    "tuneyard.datasets.ColumnMappedTextInstructionDataset": {
        "padding": _PADDING,
        "start_of_turn_token": "the answer's first token is known exactly",
    },
    "tuneyard.tokenizers.AutoTokenizer.from_pretrained": {
        "padding_side": _SIDE,
        "truncation_side": _SIDE,
        "add_bos_token": _SPECIALS,
        "add_eos_token": _SPECIALS,
    },
}
IGNORED["tuneyard.tokenizers.NeMoAutoTokenizer.from_pretrained"] = {
    **IGNORED["tuneyard.tokenizers.AutoTokenizer.from_pretrained"],
    "force_hf": "the plain transformers tokenizer is always returned (" + _SPECIALS + ")",
}

_TOKENIZER = ("tokenizer",)
_SPLIT = {"split": "train", "name": "default"}
_HF_TOKENIZER = (
    "pretrained_model_name_or_path",
    "use_fast",
    "revision",
    "subfolder",
    "model_max_length",
    "legacy",
    "padding_side",
    "truncation_side",
    "add_bos_token",
    "add_eos_token",
)


def _with_ignored(target: TargetSpec) -> TargetSpec:
    """The spec with its accepted-but-ignored keywords (warned at submit)."""
    reasons = IGNORED.get(target.name)
    return dataclasses.replace(target, ignored=reasons) if reasons else target


SPECS: list[TargetSpec] = [
    _with_ignored(s)
    for s in [
        spec(
            "tuneyard.datasets.HellaSwag",
            "trainer.data.hellaswag:HellaSwag",
            "dataset",
            ("path_or_dataset", "split", "num_samples_limit", "pad_to_max_length"),
            injected=_TOKENIZER,
            required=("path_or_dataset",),
            paths=("path_or_dataset",),
            names={"split": "train"},
            values=HellaSwagValues,
        ),
        spec(
            "tuneyard.datasets.ChatDataset",
            "trainer.data.chat:ChatDataset",
            "dataset",
            (
                "path_or_dataset_id",
                "split",
                "name",
                "seq_length",
                "padding",
                "truncation",
                "start_of_turn_token",
                "chat_template",
                "shuffle_seed",
                "mask_reasoning_content",
            ),
            injected=_TOKENIZER,
            required=("path_or_dataset_id",),
            paths=("path_or_dataset_id",),
            names=_SPLIT,
            values=ChatValues,
        ),
        spec(
            "tuneyard.datasets.ColumnMappedTextInstructionDataset",
            "trainer.data.column_mapped:ColumnMappedTextInstructionDataset",
            "dataset",
            (
                "path_or_dataset_id",
                "column_mapping",
                "split",
                "name",
                "answer_only_loss_mask",
                "seq_length",
                "padding",
                "truncation",
                "start_of_turn_token",
                "limit_dataset_samples",
                "use_hf_chat_template",
            ),
            injected=_TOKENIZER,
            required=("path_or_dataset_id", "column_mapping"),
            paths=("path_or_dataset_id",),
            names=_SPLIT,
            values=ColumnMappedValues,
        ),
        spec(
            "tuneyard.tokenizers.AutoTokenizer.from_pretrained",
            "trainer.data.tokenizer:from_pretrained",
            "tokenizer",
            _HF_TOKENIZER,
            injected=("trust_remote_code",),
            required=("pretrained_model_name_or_path",),
            paths=("pretrained_model_name_or_path",),
            values=TokenizerValues,
        ),
        spec(
            "tuneyard.tokenizers.NeMoAutoTokenizer.from_pretrained",
            "trainer.data.tokenizer:nemo_from_pretrained",
            "tokenizer",
            (*_HF_TOKENIZER, "force_hf"),
            injected=("trust_remote_code",),
            required=("pretrained_model_name_or_path",),
            paths=("pretrained_model_name_or_path",),
            values=TokenizerValues,
        ),
    ]
]

_LLM = "nemo_automodel.components.datasets.llm"
_NEMO_TOKENIZER = "tuneyard.tokenizers.NeMoAutoTokenizer.from_pretrained"
ALIASES: dict[str, str] = {
    f"{_LLM}.hellaswag.HellaSwag": "tuneyard.datasets.HellaSwag",
    f"{_LLM}.chat_dataset.ChatDataset": "tuneyard.datasets.ChatDataset",
    f"{_LLM}.ChatDataset": "tuneyard.datasets.ChatDataset",
    f"{_LLM}.column_mapped_text_instruction_dataset.ColumnMappedTextInstructionDataset": (
        "tuneyard.datasets.ColumnMappedTextInstructionDataset"
    ),
    f"{_LLM}.ColumnMappedTextInstructionDataset": (
        "tuneyard.datasets.ColumnMappedTextInstructionDataset"
    ),
    "transformers.AutoTokenizer.from_pretrained": (
        "tuneyard.tokenizers.AutoTokenizer.from_pretrained"
    ),
    "nemo_automodel.NeMoAutoTokenizer.from_pretrained": _NEMO_TOKENIZER,
    "nemo_automodel._transformers.NeMoAutoTokenizer.from_pretrained": _NEMO_TOKENIZER,
    "nemo_automodel._transformers.auto_tokenizer.NeMoAutoTokenizer.from_pretrained": (
        _NEMO_TOKENIZER
    ),
    "nemo_automodel.components._transformers.auto_tokenizer.NeMoAutoTokenizer.from_pretrained": (
        _NEMO_TOKENIZER
    ),
}
# AutoModel's HellaSwag names its limit num_samples_limit; its SQuAD-style recipes say
# limit_dataset_samples. Both mean the first N rows of the split.
SYNONYMS: dict[str, dict[str, str]] = {
    "tuneyard.datasets.HellaSwag": {"limit_dataset_samples": "num_samples_limit"},
}
