"""AutoModel's tool-use datasets: agent traces (`make_agent_chat_dataset`) and xLAM rows
(`make_xlam_dataset`), turned into OpenAI `messages` and rendered as `ChatDataset` renders
them (`trainer.data.chat.render_chat`: the loss on the assistant's text and tool calls).

Agent rows come in three forms, as AutoModel reads them: OpenAI `messages` (assistant
`tool_calls`, `role: tool` results); chatml `messages` with `tool_call` turns (a JSON
`{name, arguments}` each; consecutive ones become one assistant turn with parallel calls,
joined to an assistant text turn just before) and `tool_response` turns (paired with those
calls in order); and ShareGPT `conversations` (`from`: human, gpt, function_call,
observation, system). `tools` is a list or its JSON text.

xLAM rows are `{query, tools, answers}` (tools and answers as JSON text): a user turn with
the query and an assistant turn whose tool calls are the answers; xLAM's light parameter
types become JSON-schema types, a parameter without a default is required.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainer.data.chat import Sample, fit, normalize_messages, render_chat, require_chat_template
from trainer.data.hf_source import Selection, TokenizedDataset, locate, tokenized
from trainer.errors import data_error

_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "tool_call",
    "tool_call": "tool_call",
    "observation": "tool_response",
    "tool_response": "tool_response",
    "tool": "tool_response",
}
_AGENT_ROLES = {"system", "user", "assistant", "tool_call", "tool_response", "tool"}
_XLAM_TYPES = {
    "str": "string",
    "string": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "double": "number",
    "number": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "object": "object",
}


def _json(value: Any, what: str, where: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise data_error(f"{where}: {what} is not valid JSON: {exc}") from None


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _call(name: Any, arguments: Any, call_id: str, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise data_error(f"{where}: a tool call has no function name")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": _arguments(arguments)},
    }


def tools_of(row: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    """The row's `tools` (a list or its JSON text); None when absent or empty."""
    raw = row.get("tools")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    tools = _json(raw, "tools", where)
    if not isinstance(tools, list):
        raise data_error(f"{where}: tools must be a list (or its JSON text)")
    return tools or None


def raw_turns(row: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The row's turns as `{role, content, ...}`: its `messages`, or its ShareGPT
    `conversations` with the roles mapped."""
    messages = row.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise data_error(f"{where}: messages must be a list")
        return [m if isinstance(m, dict) else {"role": None} for m in messages]
    conversations = row.get("conversations")
    if not isinstance(conversations, list):
        raise data_error(f"{where}: the row has neither a messages nor a conversations list")
    turns = []
    for turn in conversations:
        source = turn.get("from") if isinstance(turn, dict) else None
        if source not in _SHAREGPT_ROLES:
            raise data_error(
                f"{where}: conversations role {source!r} is not one of {sorted(_SHAREGPT_ROLES)}"
            )
        out = {"role": _SHAREGPT_ROLES[source], "content": turn.get("value") or ""}
        if turn.get("reasoning_content"):
            out["reasoning_content"] = str(turn["reasoning_content"])
        turns.append(out)
    return turns


def _tool_call_group(turns: list[dict[str, Any]], i: int, prefix: str, counter: int, where: str):
    calls = []
    while i < len(turns) and turns[i].get("role") == "tool_call":
        call = _json(turns[i].get("content") or "{}", "a tool_call", where)
        if not isinstance(call, dict):
            raise data_error(f"{where}: a tool_call must be a JSON object {{name, arguments}}")
        calls.append(
            _call(call.get("name"), call.get("arguments", ""), f"{prefix}_{counter}", where)
        )
        counter, i = counter + 1, i + 1
    return calls, i, counter


def openai_messages(
    turns: list[dict[str, Any]], row_id: Any, where: str, drop_history_reasoning: bool = False
) -> list[dict[str, Any]]:
    """Agent turns as OpenAI chat messages, as AutoModel's `_convert_messages` makes them."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    counter, i = 0, 0
    prefix = f"call_{row_id}" if row_id is not None else "call"
    while i < len(turns):
        role = turns[i].get("role")
        if role not in _AGENT_ROLES:
            raise data_error(f"{where}: role {role!r} is not one of {sorted(_AGENT_ROLES)}")
        if role == "tool_call":
            calls, i, counter = _tool_call_group(turns, i, prefix, counter, where)
            pending = [c["id"] for c in calls]
            if out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
                out[-1]["tool_calls"] = calls
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": calls})
            continue
        if role in ("tool_response", "tool"):
            local = 0
            while i < len(turns) and turns[i].get("role") in ("tool_response", "tool"):
                given = turns[i].get("tool_call_id")
                call_id = given if isinstance(given, str) and given else None
                if call_id is None:
                    call_id = pending[local] if local < len(pending) else f"{prefix}_r{local}"
                message = {
                    "role": "tool",
                    "content": _arguments(turns[i].get("content") or ""),
                    "tool_call_id": call_id,
                }
                if isinstance(turns[i].get("name"), str) and turns[i]["name"]:
                    message["name"] = turns[i]["name"]
                out.append(message)
                i, local = i + 1, local + 1
            continue
        pending = []
        content = turns[i].get("content")
        message = {"role": role, "content": content if isinstance(content, str) else ""}
        if role == "assistant":
            if turns[i].get("reasoning_content"):
                message["reasoning_content"] = str(turns[i]["reasoning_content"])
            raw_calls = turns[i].get("tool_calls")
            if raw_calls is not None:
                if not isinstance(raw_calls, list):
                    raise data_error(f"{where}: an assistant's tool_calls must be a list")
                calls = []
                for call in raw_calls:
                    function = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(function, dict):
                        raise data_error(f"{where}: an assistant tool call has no function")
                    given = call.get("id")
                    call_id = given if isinstance(given, str) and given else f"{prefix}_{counter}"
                    calls.append(
                        _call(function.get("name"), function.get("arguments", ""), call_id, where)
                    )
                    counter += 1
                pending = [c["id"] for c in calls]
                message["tool_calls"] = calls
        out.append(message)
        i += 1
    if drop_history_reasoning:
        last = max((n for n, m in enumerate(out) if m["role"] == "assistant"), default=-1)
        for n, message in enumerate(out):
            if n != last:
                message.pop("reasoning_content", None)
    return out


def _length(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> int:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_history(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, seq_length: int
) -> list[dict[str, Any]]:
    """The messages with their oldest exchanges (each starting at a user turn) dropped until
    the conversation fits seq_length; leading system messages are kept. The last exchange
    alone when nothing shorter fits; the messages unchanged when they fit or have no user turn."""
    if _length(tokenizer, messages, tools) <= seq_length:
        return messages
    n_system = next((n for n, m in enumerate(messages) if m["role"] != "system"), len(messages))
    system, history = messages[:n_system], messages[n_system:]
    starts = [n for n, m in enumerate(history) if m["role"] == "user"]
    for start in starts:
        candidate = system + history[start:]
        if _length(tokenizer, candidate, tools) <= seq_length:
            return candidate
    return system + history[starts[-1] :] if starts else messages


def _trim_after_last_assistant(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = max((n for n, t in enumerate(turns) if t.get("role") == "assistant"), default=-1)
    return turns[: last + 1] if last >= 0 else turns


def _name_or_path(dataset_name: str | None, path: str | Sequence[str] | None) -> Any:
    if (dataset_name is None) == (path is None):
        raise data_error("dataset: give exactly one of dataset_name (a hub name) or path")
    return dataset_name if dataset_name is not None else path


class AgentChatDataset(TokenizedDataset):
    """Agent traces (OpenAI or chatml messages, ShareGPT conversations); the loss on the
    assistant turns. With `filter_no_assistant` a row without an assistant turn is dropped
    (else it is a data error); `trim_incomplete_last_turn` drops what follows the last
    assistant turn; `truncate_history` drops the oldest exchanges until the row fits
    seq_length, and `filter_overlong` then drops a row that still does not."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        dataset_name: str | None = None,
        path: str | Sequence[str] | None = None,
        split: str | None = None,
        revision: str | None = None,
        filter_no_assistant: bool = False,
        filter_overlong: bool = False,
        trim_incomplete_last_turn: bool = False,
        chat_template: str | None = None,
        seq_length: int | None = None,
        limit_dataset_samples: int | None = None,
        padding: str | bool = False,  # the collator pads each batch
        truncation: str | bool = False,
        mask_reasoning_content: bool = False,
        drop_history_reasoning_content: bool = False,
        truncate_history: bool = False,
    ):
        if tokenizer is None:
            raise data_error("dataset: the agent-chat dataset needs the trainer's tokenizer")
        if filter_overlong and seq_length is None:
            raise data_error("dataset: filter_overlong needs seq_length")
        require_chat_template(tokenizer, chat_template, "dataset")
        source, split_spec = locate(
            _name_or_path(dataset_name, path), split, raw_json=True, revision=revision
        )

        def row(data: dict[str, Any], position: int) -> Sample | None:
            where = f"{source.label}: row {position + 1}"
            turns = raw_turns(data, where)
            if filter_no_assistant and not any(t.get("role") == "assistant" for t in turns):
                return None
            if trim_incomplete_last_turn:
                turns = _trim_after_last_assistant(turns)
            messages = openai_messages(turns, data.get("id"), where, drop_history_reasoning_content)
            messages = normalize_messages(messages, where)
            tools = tools_of(data, where)
            if truncate_history and seq_length is not None:
                messages = fit_history(tokenizer, messages, tools, seq_length)
            sample = render_chat(tokenizer, messages, tools, where, mask_reasoning_content)
            if filter_overlong and len(sample["input_ids"]) > seq_length:
                return None
            return fit(sample, seq_length, truncation)

        options = {
            "seq_length": seq_length,
            "truncation": str(truncation),
            "flags": [
                filter_no_assistant,
                filter_overlong,
                trim_incomplete_last_turn,
                mask_reasoning_content,
                drop_history_reasoning_content,
                truncate_history,
            ],
        }
        # as AutoModel: a hub split that is already sliced keeps its slice, not the limit
        limit = None if dataset_name is not None and split_spec.sliced else limit_dataset_samples
        selection = Selection(split_spec, limit=limit)
        rows = tokenized("AgentChatDataset", source, selection, row, tokenizer, options)
        super().__init__(rows, source.label)


def xlam_tools(raw: Any, where: str) -> list[dict[str, Any]]:
    """xLAM tool definitions as OpenAI function schemas."""
    tools = _json(raw, "tools", where) or []
    if not isinstance(tools, list):
        raise data_error(f"{where}: tools must be a list (or its JSON text)")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not tool.get("name"):
            raise data_error(f"{where}: a tool has no name")
        properties: dict[str, Any] = {}
        required = []
        for name, definition in (tool.get("parameters") or {}).items():
            if not isinstance(definition, dict):
                continue
            kind = _XLAM_TYPES.get(str(definition.get("type", "string")).lower(), "string")
            prop = {"type": kind, "description": definition.get("description", "")}
            for key in ("enum", "default"):
                if key in definition:
                    prop[key] = definition[key]
            if "default" not in definition:
                required.append(name)
            properties[name] = prop
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        function = {"name": tool["name"], "description": tool.get("description", "")}
        out.append({"type": "function", "function": {**function, "parameters": schema}})
    return out


def xlam_messages(data: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A user turn with the query and an assistant turn calling the answers' tools."""
    answers = _json(data.get("answers"), "answers", where) or []
    if not isinstance(answers, list) or not isinstance(data.get("query"), str):
        raise data_error(f"{where}: an xLAM row needs a query text and an answers list")
    row_id = data.get("id")
    calls = [
        _call(
            a.get("name") if isinstance(a, dict) else None,
            a.get("arguments", "") if isinstance(a, dict) else "",
            f"call_{row_id}_{n}" if row_id is not None else f"call_{n}",
            where,
        )
        for n, a in enumerate(answers)
    ]
    if not calls:
        raise data_error(f"{where}: answers is empty: nothing to train on")
    return [
        {"role": "user", "content": data["query"]},
        {"role": "assistant", "content": "", "tool_calls": calls},
    ]


class XlamDataset(TokenizedDataset):
    """xLAM function-calling rows; the loss on the assistant's tool calls."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        dataset_name: str | Sequence[str] = "Salesforce/xlam-function-calling-60k",
        split: str | None = None,
        seq_length: int | None = None,
        limit_dataset_samples: int | None = None,
        padding: str | bool = False,  # the collator pads each batch
        truncation: str | bool = False,
        fp8: bool = False,  # unused in AutoModel too
    ):
        if tokenizer is None:
            raise data_error("dataset: the xLAM dataset needs the trainer's tokenizer")
        require_chat_template(tokenizer, None, "dataset")
        source, split_spec = locate(dataset_name, split, raw_json=True)

        def row(data: dict[str, Any], position: int) -> Sample | None:
            where = f"{source.label}: row {position + 1}"
            messages = normalize_messages(xlam_messages(data, where), where)
            tools = xlam_tools(data.get("tools"), where) or None
            return fit(render_chat(tokenizer, messages, tools, where), seq_length, truncation)

        options = {"seq_length": seq_length, "truncation": str(truncation)}
        limit = None if split_spec.sliced else limit_dataset_samples  # as AutoModel
        selection = Selection(split_spec, limit=limit)
        rows = tokenized("XlamDataset", source, selection, row, tokenizer, options)
        super().__init__(rows, source.label)
