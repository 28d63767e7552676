"""`ColumnMappedTextInstructionDataset`: instruction rows of any schema, named by a column
mapping, as prompt + answer samples with the loss on the answer.

`column_mapping` maps the logical fields `context`, `question` and `answer` to the source's
column names; `answer` and at least one of the other two are required (validation checks the
mapping's shape; a column missing from the data is a data error naming it and the columns
there are). The prompt is `context question` joined by a space; the sample is BOS, the prompt,
then ` answer` and EOS, tokenized in two parts so the boundary between them is exact. With
`answer_only_loss_mask: false` every token is a target. With `use_hf_chat_template: true`
(and a tokenizer that has one) the row becomes a system (context) / user (question) /
assistant (answer) conversation rendered by `trainer.data.chat.render_chat`. With a
`seq_length` and truncation on, prompt tokens are dropped from the left so the answer stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainer.data.chat import fit, render_chat, truncates
from trainer.data.datasets import join_prompt_and_target
from trainer.data.hf_source import Selection, TokenizedDataset, locate, tokenized
from trainer.errors import data_error

FIELDS = ("context", "question", "answer")
Sample = dict[str, list[int]]


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def bos(tokenizer: Any) -> list[int]:
    return [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []


def eos(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def prompt_and_answer(
    tokenizer: Any, prompt: str, answer: str, max_len: int | None, answer_only: bool = True
) -> Sample:
    """BOS + prompt, then the answer (a space before it unless it has one) and EOS."""
    spaced = answer if answer[:1].isspace() or not prompt else " " + answer
    sample = join_prompt_and_target(
        bos(tokenizer) + encode(tokenizer, prompt),
        encode(tokenizer, spaced) + eos(tokenizer),
        max_len,
    )
    if not answer_only:
        sample["loss_mask"] = [1] * len(sample["input_ids"])
    return sample


def text_field(row: Mapping[str, Any], column: str, where: str, field: str) -> str:
    """The text of one mapped column; numbers (CSV reads `42` as one) become text."""
    if column not in row:
        raise data_error(
            f"{where}: no column {column!r} (column_mapping.{field}); "
            f"the data has columns {sorted(row)}"
        )
    value = row[column]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise data_error(f"{where}: column {column!r} ({field}) must be text, got {value!r}")
    return str(value)


class ColumnMappedTextInstructionDataset(TokenizedDataset):
    """Context/question/answer columns of any dataset; loss on the answer."""

    def __init__(
        self,
        path_or_dataset_id: str | Sequence[str],
        column_mapping: Mapping[str, str],
        tokenizer: Any,
        *,
        split: str | None = "train",
        name: str | None = None,
        answer_only_loss_mask: bool = True,
        seq_length: int | None = None,
        padding: str | bool = "do_not_pad",  # the collator pads each batch
        truncation: str | bool = "do_not_truncate",
        start_of_turn_token: str | None = None,  # the answer's start is known exactly
        limit_dataset_samples: int | None = None,
        use_hf_chat_template: bool = False,
    ):
        mapping = dict(column_mapping)
        if "answer" not in mapping or not ({"context", "question"} & set(mapping)):
            raise data_error(
                "dataset.column_mapping: map answer and at least one of context, question"
            )
        chat = use_hf_chat_template and bool(getattr(tokenizer, "chat_template", None))
        cut = seq_length if truncates(truncation) else None
        source, split_spec = locate(path_or_dataset_id, split, name=name)

        def row(data: dict[str, Any], position: int) -> Sample | None:
            where = f"{source.label}: row {position + 1}"
            texts = {f: text_field(data, mapping[f], where, f) for f in FIELDS if f in mapping}
            if chat:
                return self._chat_sample(tokenizer, texts, where, answer_only_loss_mask, cut)
            prompt = " ".join(texts[f] for f in ("context", "question") if f in texts)
            return prompt_and_answer(tokenizer, prompt, texts["answer"], cut, answer_only_loss_mask)

        arguments = {
            "mapping": mapping,
            "answer_only": answer_only_loss_mask,
            "cut": cut,
            "chat": chat,
        }
        selection = Selection(split_spec, limit=limit_dataset_samples)
        rows = tokenized("ColumnMapped", source, selection, row, tokenizer, arguments)
        super().__init__(rows, source.label)

    @staticmethod
    def _chat_sample(
        tokenizer: Any, texts: dict[str, str], where: str, answer_only: bool, cut: int | None
    ) -> Sample | None:
        messages = [{"role": "system", "content": texts["context"]}] if "context" in texts else []
        messages += [
            {"role": "user", "content": texts.get("question", "")},
            {"role": "assistant", "content": texts["answer"]},
        ]
        sample = render_chat(tokenizer, messages, None, where)
        if not answer_only:
            sample["loss_mask"] = [1] * len(sample["input_ids"])
        return fit(sample, cut, True)
