"""ChatDataset: OpenAI messages with tool calls and results; the loss on exactly the assistant
turns (text, tool calls, end-of-turn marker); `{% generation %}` templates; truncation;
packing; a hub-cache repo with Arrow-typed (null-filled) rows; malformed rows named."""

from __future__ import annotations

import pytest
from fake_hub import write_hub_dataset
from sample_text import context_of, targets_of
from sft_fixtures import TOOL_TEMPLATE, chat_rows, write_jsonl

from trainer.data.chat import ChatDataset
from trainer.data.collate import Collator, PackedDataset
from trainer.errors import TrainerError


def test_tool_calls_and_answers_are_targets_tool_results_are_not(tmp_path, tok):
    rows = chat_rows(3, tool_every=2)
    ds = ChatDataset(
        str(write_jsonl(tmp_path / "chat.jsonl", rows)), tok, chat_template=TOOL_TEMPLATE
    )
    tool_row, plain_row = ds[0], ds[1]
    # row 0: user, assistant tool call, tool result, assistant answer (tools in the system part)
    user, call, result, answer = rows[0]["messages"]
    digits = call["tool_calls"][0]["function"]["arguments"]["digits"]
    assert targets_of(tok, tool_row) == (
        f'<call>reverse {{"digits": "{digits}"}}</call><|end|>{answer["content"]}<|end|>'
    )
    context = context_of(tok, tool_row)
    assert context.startswith('<|system|>[{"type": "function"')
    assert context.endswith(
        f"<|user|>{user['content']}<|end|><|assistant|><|tool|>{result['content']}<|end|>"
        "<|assistant|>"
    )
    assert targets_of(tok, plain_row) == rows[1]["messages"][-1]["content"] + "<|end|>"
    # the ids are the template's own rendering, tokenized once
    full = tok.apply_chat_template(rows[1]["messages"], tokenize=False)
    assert plain_row["input_ids"] == tok(full, add_special_tokens=False)["input_ids"]


def test_a_generation_marked_template_masks_through_transformers(tmp_path, tok):
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}"
        "{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
        "{% else %}{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    )
    rows = chat_rows(2, tool_every=0)
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    sample = ChatDataset(str(path), tok, chat_template=template)[0]
    user, answer = rows[0]["messages"]
    assert targets_of(tok, sample) == answer["content"] + "<|end|>"
    assert context_of(tok, sample) == f"<|user|>{user['content']}<|end|><|assistant|>"


def test_truncation_cuts_to_seq_length_and_drops_rows_without_targets(tmp_path, tok):
    rows = chat_rows(4, tool_every=0)
    rows[1]["messages"][0]["content"] = "Reverse " + "1 " * 80 + ":"  # no assistant token left
    path = str(write_jsonl(tmp_path / "chat.jsonl", rows))
    ds = ChatDataset(path, tok, seq_length=16, truncation=True)
    assert len(ds) == 3
    assert all(len(ds[i]["input_ids"]) <= 16 for i in range(3))
    whole = ChatDataset(path, tok, seq_length=16)  # do_not_truncate: AutoModel's default
    assert len(whole) == 4 and len(whole[1]["input_ids"]) > 16


def test_split_slice_and_shuffle_seed(tmp_path, tok):
    path = str(write_jsonl(tmp_path / "chat.jsonl", chat_rows(10, tool_every=0)))
    first = ChatDataset(path, tok, split="train[:4]", shuffle_seed=1)
    rest = ChatDataset(path, tok, split="train[4:]", shuffle_seed=1)
    seen = [context_of(tok, d[i]) for d in (first, rest) for i in range(len(d))]
    in_order = [context_of(tok, d) for d in ChatDataset(path, tok)]
    assert len(first) == 4 and len(rest) == 6
    assert sorted(seen) == sorted(in_order) and seen != in_order


def test_packed_chat_rows_keep_labels_on_assistant_tokens(tmp_path, tok):
    ds = ChatDataset(str(write_jsonl(tmp_path / "c.jsonl", chat_rows(6))), tok,
                     chat_template=TOOL_TEMPLATE)  # fmt: skip
    packed = PackedDataset(ds, 1024)
    assert len(packed) < len(ds)
    batch = Collator(tok.pad_token_id, packed=True)([packed[i] for i in range(len(packed))])
    labels = batch["labels"][batch["labels"] != -100].tolist()
    expected = [
        t
        for i in range(len(ds))
        for t, m in zip(ds[i]["input_ids"][1:], ds[i]["loss_mask"][1:], strict=False)
        if m
    ]
    assert sorted(labels) == sorted(expected)


def test_a_hub_repo_of_arrow_typed_rows_drops_the_null_filled_keys(
    tmp_path, tok, offline_hub, monkeypatch
):
    hub = tmp_path / "hub"
    rows = chat_rows(4, tool_every=2)
    for row in rows:  # Arrow needs one schema: every row gets a tools column
        row.setdefault("tools", None)
    write_hub_dataset(hub, "org/toolcalls", {"train": rows}, config="default")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    ds = ChatDataset("org/toolcalls", tok, split="train", chat_template=TOOL_TEMPLATE)
    digits = rows[0]["messages"][1]["tool_calls"][0]["function"]["arguments"]["digits"]
    assert targets_of(tok, ds[0]).startswith(f'<call>reverse {{"digits": "{digits}"}}</call>')
    # row 1 has no tool call: Arrow's null tool_calls on it is dropped
    assert targets_of(tok, ds[1]) == rows[1]["messages"][-1]["content"] + "<|end|>"


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda r: r.pop("messages"), r"row 2: field 'messages'"),
        (lambda r: r["messages"][0].update(role="robot"), r"row 2: messages\[0\].role is 'robot'"),
        (lambda r: r["messages"].pop(), r"row 2: no assistant message"),
        (lambda r: r["messages"][0].update(content=7), r"row 2: messages\[0\].content"),
    ],
)
def test_a_malformed_row_is_a_data_error_naming_file_row_and_field(tmp_path, tok, edit, words):
    rows = chat_rows(3, tool_every=0)
    edit(rows[1])
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TrainerError, match=words) as err:
        ChatDataset(str(path), tok)
    assert str(path) in err.value.message


def test_a_broken_json_line_and_a_missing_template_are_data_errors(tmp_path, tok):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": []}\n{"messages": [\n')
    with pytest.raises(TrainerError, match=r"bad.jsonl:2: not valid JSON"):
        ChatDataset(str(path), tok)
    tok.chat_template = None
    with pytest.raises(TrainerError, match="no chat template"):
        ChatDataset(str(path), tok)


THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m.get('reasoning_content') %}<think>{{ m['reasoning_content'] }}</think>{% endif %}"
    "{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.mark.parametrize("generation", [False, True])
def test_mask_reasoning_content_takes_the_thinking_out_of_the_loss(tmp_path, tok, generation):
    template = THINKING_TEMPLATE
    if generation:  # the same rendering, its assistant tokens marked by the template
        turn = THINKING_TEMPLATE.split("|>", 1)[1].split("{% endfor %}")[0]
        template = (
            "{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}"
            f"{{% generation %}}{turn}{{% endgeneration %}}{{% else %}}{turn}{{% endif %}}"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
        )
    messages = [
        {"role": "user", "content": "Reverse 12:"},
        {"role": "assistant", "reasoning_content": "flip 1 and 2", "content": "2 1"},
    ]
    path = str(write_jsonl(tmp_path / "think.jsonl", [{"messages": messages}]))
    kept = ChatDataset(path, tok, chat_template=template)[0]
    masked = ChatDataset(path, tok, chat_template=template, mask_reasoning_content=True)[0]
    assert targets_of(tok, kept) == "<think>flip 1 and 2</think>2 1<|end|>"
    assert targets_of(tok, masked) == "2 1<|end|>"
    assert masked["input_ids"] == kept["input_ids"]
