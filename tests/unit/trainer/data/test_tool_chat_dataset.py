"""AgentChatDataset and XlamDataset (trainer.data.tool_chat): AutoModel's agent-trace forms
(ShareGPT conversations, chatml tool_call/tool_response turns, OpenAI messages) and xLAM rows
become OpenAI messages whose assistant text and tool calls are the only targets; the
filters, history trimming and a hub revision; malformed rows named."""

from __future__ import annotations

import json

import pytest
from fake_hub import COMMIT, write_hub_dataset
from sample_text import context_of, targets_of
from sft_fixtures import TOOL_TEMPLATE, write_jsonl

from trainer.data.tool_chat import AgentChatDataset, XlamDataset, fit_history, openai_messages
from trainer.errors import TrainerError

TOOLS = [{"type": "function", "function": {"name": "reverse", "parameters": {}}}]


def _sharegpt(n: int) -> dict:
    return {
        "tools": json.dumps(TOOLS),
        "conversations": [
            {"from": "human", "value": f"reverse {n}{n + 1}"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "reverse", "arguments": {"d": n}}),
            },
            {"from": "observation", "value": f"{n + 1}{n}"},
            {"from": "gpt", "value": f"it is {n + 1}{n}"},
        ],
    }


def test_sharegpt_calls_and_answers_are_targets_observations_are_not(tmp_path, tok):
    path = write_jsonl(tmp_path / "glaive.jsonl", [_sharegpt(1), _sharegpt(3)])
    ds = AgentChatDataset(tok, path=str(path), chat_template=TOOL_TEMPLATE)
    assert len(ds) == 2
    assert targets_of(tok, ds[0]) == '<call>reverse "{\\"d\\": 1}"</call><|end|>it is 21<|end|>'
    context = context_of(tok, ds[0])
    assert context.startswith('<|system|>[{"type": "function"')
    assert context.endswith("<|user|>reverse 12<|end|><|assistant|><|tool|>21<|end|><|assistant|>")


def test_chatml_tool_calls_merge_into_the_assistant_turn_and_pair_with_results():
    turns = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "thinking"},
        {"role": "tool_call", "content": '{"name": "a", "arguments": {"x": 1}}'},
        {"role": "tool_call", "content": '{"name": "b", "arguments": "{}"}'},
        {"role": "tool_response", "content": "ra"},
        {"role": "tool_response", "content": {"r": "b"}},
        {"role": "assistant", "content": "done", "reasoning_content": "why"},
    ]
    out = openai_messages(turns, 7, "row 1")
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = out[1]["tool_calls"]
    assert out[1]["content"] == "thinking"
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [
        ("call_7_0", '{"x": 1}'),
        ("call_7_1", "{}"),
    ]
    assert [m["tool_call_id"] for m in out[2:4]] == ["call_7_0", "call_7_1"]
    assert out[3]["content"] == '{"r": "b"}'
    dropped = openai_messages(turns[:2] + turns[-1:] + turns[-1:], None, "row", True)
    assert "reasoning_content" not in dropped[2] and dropped[3]["reasoning_content"] == "why"


def test_filters_trim_and_missing_assistant(tmp_path, tok):
    no_answer = {"messages": [{"role": "user", "content": "hello"}]}
    trailing = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "unanswered"},
        ]
    }
    path = str(write_jsonl(tmp_path / "t.jsonl", [no_answer, trailing]))
    ds = AgentChatDataset(
        tok,
        path=path,
        chat_template=TOOL_TEMPLATE,
        filter_no_assistant=True,
        trim_incomplete_last_turn=True,
    )
    assert len(ds) == 1
    assert context_of(tok, ds[0]) == "<|user|>q<|end|><|assistant|>"
    with pytest.raises(TrainerError, match="row 1: no assistant message"):
        AgentChatDataset(tok, path=path, chat_template=TOOL_TEMPLATE)


def test_truncate_history_keeps_the_last_exchange_and_filter_overlong_drops(tmp_path, tok):
    long = "word " * 40
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": long},
        {"role": "assistant", "content": long},
        {"role": "user", "content": "short"},
        {"role": "assistant", "content": "ok"},
    ]
    kept = fit_history(tok, messages, None, 24)
    assert [m["content"] for m in kept] == ["sys", "short", "ok"]
    assert fit_history(tok, messages, None, 10_000) is messages
    rows = [{"messages": messages}, {"messages": messages[:3]}]
    path = str(write_jsonl(tmp_path / "h.jsonl", rows))
    ds = AgentChatDataset(
        tok,
        path=path,
        chat_template=TOOL_TEMPLATE,
        seq_length=24,
        truncate_history=True,
        filter_overlong=True,
    )
    assert len(ds) == 1  # the second row's only exchange is too long even alone
    assert targets_of(tok, ds[0]) == "ok<|end|>"


def test_name_xor_path_and_overlong_needs_length(tmp_path, tok):
    with pytest.raises(TrainerError, match="exactly one of dataset_name"):
        AgentChatDataset(tok, chat_template=TOOL_TEMPLATE)
    with pytest.raises(TrainerError, match="filter_overlong needs seq_length"):
        AgentChatDataset(tok, path="x.jsonl", filter_overlong=True, chat_template=TOOL_TEMPLATE)


def test_a_bad_role_and_bad_tool_call_are_named(tmp_path, tok):
    bad_role = {"conversations": [{"from": "robot", "value": "x"}]}
    path = str(write_jsonl(tmp_path / "r.jsonl", [bad_role]))
    with pytest.raises(TrainerError, match="row 1: conversations role 'robot'"):
        AgentChatDataset(tok, path=path, chat_template=TOOL_TEMPLATE)
    bad_call = {"messages": [{"role": "tool_call", "content": "{not json"}]}
    path = str(write_jsonl(tmp_path / "c.jsonl", [bad_call]))
    with pytest.raises(TrainerError, match="row 1: a tool_call is not valid JSON"):
        AgentChatDataset(tok, path=path, chat_template=TOOL_TEMPLATE)


def test_a_hub_revision_is_read_from_its_ref(tmp_path, tok, offline_hub, monkeypatch):
    hub = tmp_path / "hub"
    rows = [
        {"tools": json.dumps(TOOLS), "conversations": _sharegpt(n)["conversations"]} for n in (1, 5)
    ]
    write_hub_dataset(hub, "org/traces", {"train": rows}, config="default")
    # the hub client records a ref under refs/<revision>
    ref = hub / "datasets--org--traces" / "refs" / "refs" / "convert" / "parquet"
    ref.parent.mkdir(parents=True)
    (hub / "datasets--org--traces" / "refs" / "main").unlink()  # only the revision names it
    ref.write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    ds = AgentChatDataset(
        tok,
        dataset_name="org/traces",
        revision="refs/convert/parquet",
        split="train",
        chat_template=TOOL_TEMPLATE,
        limit_dataset_samples=1,
    )
    assert len(ds) == 1 and targets_of(tok, ds[0]).endswith("it is 21<|end|>")
    with pytest.raises(TrainerError, match="org/traces"):
        AgentChatDataset(
            tok, dataset_name="org/traces", revision="nope", chat_template=TOOL_TEMPLATE
        )


def _xlam(n: int) -> dict:
    tools = [
        {
            "name": "reverse",
            "description": "Reverse digits",
            "parameters": {
                "digits": {"type": "str", "description": "the digits"},
                "times": {"type": "int", "description": "repeat", "default": 1},
            },
        }
    ]
    answers = [{"name": "reverse", "arguments": {"digits": f"{n}{n + 1}"}}]
    return {
        "id": n,
        "query": f"reverse {n}{n + 1}",
        "tools": json.dumps(tools),
        "answers": json.dumps(answers),
    }


def test_xlam_query_is_context_and_the_tool_call_is_the_target(tmp_path, tok):
    tok.chat_template = TOOL_TEMPLATE
    path = str(write_jsonl(tmp_path / "xlam.jsonl", [_xlam(1), _xlam(4), _xlam(6)]))
    ds = XlamDataset(tok, dataset_name=path, limit_dataset_samples=2)
    assert len(ds) == 2
    # a sliced split keeps its slice and ignores the limit, as AutoModel's builder does
    assert len(XlamDataset(tok, dataset_name=path, split="train[:3]", limit_dataset_samples=1)) == 3
    assert targets_of(tok, ds[0]) == '<call>reverse "{\\"digits\\": \\"12\\"}"</call><|end|>'
    context = context_of(tok, ds[0])
    assert context.endswith("<|user|>reverse 12<|end|><|assistant|>")
    schema = json.loads(context[len("<|system|>") : context.index("<|end|>")])[0]["function"]
    assert schema["parameters"] == {
        "type": "object",
        "properties": {
            "digits": {"type": "string", "description": "the digits"},
            "times": {"type": "integer", "description": "repeat", "default": 1},
        },
        "required": ["digits"],
    }


def test_xlam_rows_without_answers_or_a_template_are_refused(tmp_path, tok):
    tok.chat_template = TOOL_TEMPLATE
    row = {**_xlam(1), "answers": "[]"}
    path = str(write_jsonl(tmp_path / "x.jsonl", [row]))
    with pytest.raises(TrainerError, match="row 1: answers is empty"):
        XlamDataset(tok, dataset_name=path)
    tok.chat_template = None
    with pytest.raises(TrainerError, match="no chat template"):
        XlamDataset(tok, dataset_name=path)
