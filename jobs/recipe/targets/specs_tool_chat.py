"""AutoModel's tool-use dataset builders: the agent-trace builder (`make_agent_chat_dataset`)
and the xLAM builder (`make_xlam_dataset`), run by `trainer.data.tool_chat`. Their specs,
aliases and keyword synonyms, merged into the allowlist by `jobs.recipe.targets.table`.

Both take AutoModel's keyword names. The agent builder reads a hub name (`dataset_name`,
at an optional `revision`) or local JSON/JSONL files (`path`), exactly one of them; its
`chat_template` may be a file inside the data roots, read at submit. `padding` is accepted
and ignored (the collator pads each batch), as is xLAM's `fp8` (unused in AutoModel too).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated

from pydantic import AfterValidator, StringConstraints, model_validator

from jobs.recipe.targets.spec import TargetSpec, spec
from jobs.recipe.targets.specs_sft import (
    ChatTemplate,
    Padding,
    PositiveInt,
    Truncation,
    _Values,
)

_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def _git_ref(value: str) -> str:
    if not _REF.fullmatch(value) or ".." in value or value.endswith("/") or "//" in value:
        raise ValueError("a branch, tag or commit of the hub repo (e.g. main, refs/pr/1)")
    return value


# A hub revision: a branch, tag, commit or ref such as `refs/convert/parquet` (its slashes
# name a git ref, never a local path: it is only passed to the hub client).
Revision = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200),
    AfterValidator(_git_ref),
]
_PADDING = "the collator pads each batch to its longest sample; pad tokens carry no loss"


class AgentChatValues(_Values):
    dataset_name: str | None = None
    path: str | list[str] | None = None
    revision: Revision | None = None
    filter_no_assistant: bool = False
    filter_overlong: bool = False
    trim_incomplete_last_turn: bool = False
    chat_template: ChatTemplate | None = None
    seq_length: PositiveInt | None = None
    limit_dataset_samples: PositiveInt | None = None
    padding: Padding = False
    truncation: Truncation = False
    mask_reasoning_content: bool = False
    drop_history_reasoning_content: bool = False
    truncate_history: bool = False

    @model_validator(mode="after")
    def _one_source_and_a_length(self) -> AgentChatValues:
        if (self.dataset_name is None) == (self.path is None):
            raise ValueError("give exactly one of dataset_name (a hub name) or path (local files)")
        if self.filter_overlong and self.seq_length is None:
            raise ValueError("filter_overlong drops rows longer than seq_length: give seq_length")
        return self


class XlamValues(_Values):
    seq_length: PositiveInt | None = None
    limit_dataset_samples: PositiveInt | None = None
    padding: Padding = False
    truncation: Truncation = False
    fp8: bool = False


_AGENT = "tuneyard.datasets.AgentChatDataset"
_XLAM = "tuneyard.datasets.XlamDataset"
IGNORED: dict[str, dict[str, str]] = {
    _AGENT: {"padding": _PADDING},
    _XLAM: {"padding": _PADDING, "fp8": "AutoModel's xLAM builder does not use it either"},
}


def _with_ignored(target: TargetSpec) -> TargetSpec:
    return dataclasses.replace(target, ignored=IGNORED[target.name])


SPECS: list[TargetSpec] = [
    _with_ignored(
        spec(
            _AGENT,
            "trainer.data.tool_chat:AgentChatDataset",
            "dataset",
            ("split", *AgentChatValues.model_fields),
            injected=("tokenizer",),
            paths=("dataset_name", "path"),
            names={"split": "train"},
            values=AgentChatValues,
        )
    ),
    _with_ignored(
        spec(
            _XLAM,
            "trainer.data.tool_chat:XlamDataset",
            "dataset",
            ("dataset_name", "split", *XlamValues.model_fields),
            injected=("tokenizer",),
            paths=("dataset_name",),
            names={"split": "train"},
            values=XlamValues,
        )
    ),
]

_LLM = "nemo_automodel.components.datasets.llm"
ALIASES: dict[str, str] = {
    f"{_LLM}.agent_chat.make_agent_chat_dataset": _AGENT,
    f"{_LLM}.make_agent_chat_dataset": _AGENT,
    f"{_LLM}.xlam.make_xlam_dataset": _XLAM,
    f"{_LLM}.make_xlam_dataset": _XLAM,
}
SYNONYMS: dict[str, dict[str, str]] = {}
