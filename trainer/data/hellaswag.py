"""`HellaSwag`: the HellaSwag commonsense benchmark as fine-tuning data, context then the
correct ending, with the loss on the ending.

A row has HellaSwag's columns: `ctx` (the context), `endings` (four candidate endings) and
`label` (the index of the correct one, a string such as "2" in the published files, or an
int). The sample is BOS + `ctx`, then ` ending` + EOS as the target; other columns
(`activity_label`, `ctx_a`, `ctx_b`, `source_id`, ...) are not read. The published test
split has no labels (`label: ""`): training on it is a data error naming the row.
"""

from __future__ import annotations

from typing import Any

from trainer.data.column_mapped import prompt_and_answer
from trainer.data.hf_source import Selection, TokenizedDataset, locate, tokenized
from trainer.errors import data_error

Sample = dict[str, list[int]]


def gold_ending(row: dict[str, Any], where: str) -> tuple[str, str]:
    """(context, correct ending) of one HellaSwag row; a data error names what is wrong."""
    ctx, endings, label = row.get("ctx"), row.get("endings"), row.get("label")
    if not isinstance(ctx, str) or not ctx.strip():
        raise data_error(f"{where}: field 'ctx' must be the context text, got {ctx!r}")
    if not isinstance(endings, list) or not all(isinstance(e, str) for e in endings):
        raise data_error(f"{where}: field 'endings' must be a list of texts, got {endings!r}")
    try:
        index = int(label)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise data_error(
            f"{where}: field 'label' must be the index of the correct ending, got {label!r} "
            "(HellaSwag's test split has no labels: train on train or validation)"
        ) from None
    if not 0 <= index < len(endings):
        raise data_error(f"{where}: label {index} is outside the {len(endings)} endings")
    return ctx.rstrip(), endings[index].strip()


class HellaSwag(TokenizedDataset):
    """HellaSwag rows (parquet, JSON/JSONL, a saved dataset or `Rowan/hellaswag` in the hub
    cache): context, then the correct ending as the target."""

    def __init__(
        self,
        path_or_dataset: str,
        tokenizer: Any,
        split: str = "train",
        num_samples_limit: int | None = None,
        pad_to_max_length: bool = True,  # the collator pads each batch to its longest row
    ):
        source, split_spec = locate(path_or_dataset, split)

        def row(data: dict[str, Any], position: int) -> Sample:
            ctx, ending = gold_ending(data, f"{source.label}: row {position + 1}")
            return prompt_and_answer(tokenizer, ctx, ending, None)

        selection = Selection(split_spec, limit=num_samples_limit)
        rows = tokenized("HellaSwag", source, selection, row, tokenizer, {})
        super().__init__(rows, source.label)
