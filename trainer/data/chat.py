"""`ChatDataset`: OpenAI-style `messages` rows rendered with the tokenizer's chat template,
the loss on what the assistant says (its text and its tool calls) and on nothing else.

A row is `{"messages": [...], "tools": [...]?}`; a message has a `role` (system, user,
assistant or tool), `content` (text, a list of text parts, or null beside `tool_calls`),
and for the assistant optionally `tool_calls` (`[{type, function: {name, arguments}}]`);
tool results are `role: tool` messages. `tools` (function schemas) go to the template.

`render_chat` finds the assistant tokens in one of two ways. A template with
`{% generation %}` blocks marks them itself (transformers' assistant-token mask). Any other
template is rendered once per assistant turn: what the conversation renders to up to the
generation prompt before the turn is context, what the turn adds (its text, tool calls and
end-of-turn marker) is target; the whole conversation is tokenized once and each token is a
target when its characters lie in a target span, so the ids are exactly those the template
gives. A template whose earlier turns render differently once later turns exist cannot be
split this way; such a row is a data error that says to use `{% generation %}` markers.

With `mask_reasoning_content`, an assistant turn's `reasoning_content` (which templates
such as Qwen3's render as a thinking block) is context, not target: the conversation is
rendered again with that turn's reasoning cleared, and the characters where the two
renderings differ leave the loss, as AutoModel finds them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from trainer.data.hf_source import Selection, TokenizedDataset, locate, tokenized
from trainer.errors import TrainerError, data_error

ROLES = ("system", "user", "assistant", "tool")
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
_NO_TRUNCATION = (None, False, "do_not_truncate")
Sample = dict[str, list[int]]


def truncates(truncation: str | bool | None) -> bool:
    """AutoModel's truncation values: False/None/"do_not_truncate" keep whole samples."""
    return truncation not in _NO_TRUNCATION


def _without_nulls(value: Any) -> Any:
    """Arrow fills keys a row lacks with null; a template tests `'tool_calls' in message`."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def normalize_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """Checked messages: known roles, text content (parts joined), nulls dropped."""
    if not isinstance(messages, list) or not messages:
        raise data_error(f"{where}: field 'messages' must be a non-empty list of messages")
    out = []
    for number, message in enumerate(messages):
        at = f"{where}: messages[{number}]"
        if not isinstance(message, dict):
            raise data_error(f"{at} must be an object with 'role' and 'content'")
        message = _without_nulls(message)
        if message.get("role") not in ROLES:
            raise data_error(f"{at}.role is {message.get('role')!r}; use one of {list(ROLES)}")
        content = message.get("content", "")
        if isinstance(content, list):
            content = " ".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
        elif not isinstance(content, str):
            raise data_error(f"{at}.content must be text or a list of text parts")
        if not content and not message.get("tool_calls") and message["role"] != "tool":
            raise data_error(f"{at} has no content and no tool_calls")
        out.append({**message, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise data_error(f"{where}: no assistant message: nothing to train on")
    return out


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=prompt
    )


def _assistant_spans(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, where: str
) -> tuple[str, list[tuple[int, int]]]:
    """The whole conversation's text and the character spans each assistant turn adds."""
    full = _render(tokenizer, messages, tools, False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], tools, True) if index else ""
        after = _render(tokenizer, messages[: index + 1], tools, False)
        if not (full.startswith(after) and after.startswith(before)):
            raise data_error(
                f"{where}: the chat template renders turn {index} differently once later turns "
                "follow, so the assistant tokens cannot be found; give dataset.chat_template "
                "a template that marks them with {% generation %} ... {% endgeneration %}"
            )
        spans.append((len(before), len(after)))
    return full, spans


def _masked_by_offsets(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> Sample:
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        int(any(lo <= start < hi for lo, hi in spans) and end > start)
        for start, end in encoded["offset_mapping"]
    ]
    return {"input_ids": list(encoded["input_ids"]), "loss_mask": mask}


def _masked_by_pieces(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> Sample:
    """Slow tokenizers have no offsets: encode context and target pieces in turn."""
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for lo, hi in [*spans, (len(text), len(text))]:
        for piece, target in ((text[cursor:lo], 0), (text[lo:hi], 1)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids += piece_ids
                mask += [target] * len(piece_ids)
        cursor = hi
    return {"input_ids": ids, "loss_mask": mask}


def _masked_by_generation(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> Sample:
    encoded = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return {
        "input_ids": list(encoded["input_ids"]),
        "loss_mask": [int(bool(m)) for m in encoded["assistant_masks"]],
    }


def _reasoning_spans(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, full: str
) -> list[tuple[int, int]]:
    """The character spans of `full` that the assistant turns' `reasoning_content` renders
    to: the conversation rendered with one turn's reasoning cleared differs from `full`
    exactly there (nowhere, for a template that does not render reasoning)."""
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant" or not message.get("reasoning_content"):
            continue
        cleared = [*messages[:index], {**message, "reasoning_content": ""}, *messages[index + 1 :]]
        other = _render(tokenizer, cleared, tools, False)
        start = len(os.path.commonprefix([full, other]))
        tail = len(os.path.commonprefix([full[start:][::-1], other[start:][::-1]]))
        if len(full) - tail > start:
            spans.append((start, len(full) - tail))
    return spans


def _without(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` with the characters of `holes` taken out."""
    out = []
    for lo, hi in spans:
        cursor = lo
        for hole_lo, hole_hi in sorted(holes):
            if hole_hi <= cursor or hole_lo >= hi:
                continue
            if hole_lo > cursor:
                out.append((cursor, hole_lo))
            cursor = max(cursor, hole_hi)
        if cursor < hi:
            out.append((cursor, hi))
    return out


def _unmask_reasoning(
    tokenizer: Any, sample: Sample, text: str, holes: list[tuple[int, int]], where: str
) -> Sample:
    """A `{% generation %}` template's mask with the reasoning tokens taken out, through the
    fast tokenizer's offsets of the same rendered text."""
    fast = getattr(tokenizer, "is_fast", False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=fast)
    if not fast or encoded["input_ids"] != sample["input_ids"]:
        raise data_error(
            f"{where}: mask_reasoning_content needs a fast tokenizer whose ids of the rendered "
            "text are the template's; set mask_reasoning_content: false or use a fast tokenizer"
        )
    in_hole = [any(lo <= start < hi for lo, hi in holes) for start, _ in encoded["offset_mapping"]]
    mask = [0 if hole else m for m, hole in zip(sample["loss_mask"], in_hole, strict=True)]
    return {"input_ids": sample["input_ids"], "loss_mask": mask}


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Any,
    where: str,
    mask_reasoning: bool = False,
) -> Sample:
    """Token ids of the rendered conversation and a mask that is 1 on assistant tokens (but
    on those of the turns' `reasoning_content` with `mask_reasoning`)."""
    holes: list[tuple[int, int]] = []
    try:
        if _GENERATION.search(tokenizer.chat_template or ""):
            sample = _masked_by_generation(tokenizer, messages, tools)
            if not mask_reasoning:
                return sample
            text = _render(tokenizer, messages, tools, False)
            holes = _reasoning_spans(tokenizer, messages, tools, text)
            return _unmask_reasoning(tokenizer, sample, text, holes, where) if holes else sample
        text, spans = _assistant_spans(tokenizer, messages, tools, where)
        if mask_reasoning:
            spans = _without(spans, _reasoning_spans(tokenizer, messages, tools, text))
    except TrainerError:
        raise
    except Exception as exc:  # jinja2 raises its own kinds (raise_exception, undefined names)
        raise data_error(f"{where}: the chat template cannot render this row: {exc}") from None
    if getattr(tokenizer, "is_fast", False):
        return _masked_by_offsets(tokenizer, text, spans)
    return _masked_by_pieces(tokenizer, text, spans)


def fit(sample: Sample, seq_length: int | None, truncation: str | bool | None) -> Sample | None:
    """Cut to seq_length when truncation is on; None when no target token is left."""
    if seq_length is not None and truncates(truncation):
        sample = {key: value[:seq_length] for key, value in sample.items()}
    return sample if any(sample["loss_mask"]) else None


def require_chat_template(tokenizer: Any, chat_template: str | None, what: str) -> None:
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if not getattr(tokenizer, "chat_template", None):
        raise data_error(
            f"{what}: the tokenizer has no chat template; give dataset.chat_template or use a "
            "tokenizer that ships one"
        )


class ChatDataset(TokenizedDataset):
    """OpenAI-format chat rows (tool calls included); loss on the assistant turns."""

    def __init__(
        self,
        path_or_dataset_id: str | Sequence[str],
        tokenizer: Any,
        *,
        split: str | None = None,
        name: str | None = None,
        seq_length: int | None = None,
        padding: str | bool = "do_not_pad",  # the collator pads each batch
        truncation: str | bool = "do_not_truncate",
        start_of_turn_token: str | None = None,  # turns are found from the template itself
        chat_template: str | None = None,
        shuffle_seed: int | None = None,
        mask_reasoning_content: bool = False,
    ):
        if tokenizer is None:
            raise data_error("dataset: ChatDataset needs the trainer's tokenizer")
        require_chat_template(tokenizer, chat_template, "dataset")
        source, split_spec = locate(path_or_dataset_id, split, name=name, raw_json=True)

        def row(data: dict[str, Any], position: int) -> Sample | None:
            where = f"{source.label}: row {position + 1}"
            messages = normalize_messages(data.get("messages"), where)
            tools = data.get("tools")
            tools = _without_nulls(tools) if isinstance(tools, list) and tools else None
            sample = render_chat(tokenizer, messages, tools, where, mask_reasoning_content)
            return fit(sample, seq_length, truncation)

        cut = seq_length if truncates(truncation) else None
        # the cache key: a masked rendering is another dataset (kept out when off, so the
        # rows cached before this option existed are still found)
        options = {"seq_length": cut} | (
            {"mask_reasoning_content": True} if mask_reasoning_content else {}
        )
        rows = tokenized(
            "ChatDataset",
            source,
            Selection(split_spec, shuffle_seed),
            row,
            tokenizer,
            options,
        )
        super().__init__(rows, source.label)
