"""Data files in the real layouts of AutoModel's instruction and chat datasets, made by tests.

HellaSwag rows carry the published columns (`ind`, `activity_label`, `ctx_a`, `ctx_b`, `ctx`,
`endings`, `source_id`, `split`, `split_type`, `label` as a string); chat rows are OpenAI
`messages` with tool calls and tool results and a `tools` schema list; column-mapped rows
use the `instruction`/`output` and `definition`/`inputs`/`targets` schemas of AutoModel's
guide. The task in every file is the one the tiny model learns (reverse a number's digits),
so a short run's loss falls. `TOOL_TEMPLATE` is a chat template that renders tool calls.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

TOOL_TEMPLATE = (
    "{% if tools %}<|system|>{{ tools | tojson }}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    "<call>{{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}</call>"
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
REVERSE_TOOL = {
    "type": "function",
    "function": {
        "name": "reverse",
        "description": "Reverse a string",
        "parameters": {"type": "object", "properties": {"digits": {"type": "string"}}},
    },
}


def instruction_pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    """n prompt/completion pairs `Reverse 123:` -> ` 3 2 1` (this module's own, so the
    files stay the same whatever the trainer's demo assets become)."""
    rng = random.Random(seed)
    digits = [str(rng.randint(10, 99999)) for _ in range(n)]
    return [{"prompt": f"Reverse {d}:", "completion": " " + " ".join(d[::-1])} for d in digits]


def hellaswag_rows(n: int, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """HellaSwag-shaped rows: context `Reverse N:`, four endings, the right one at `label`."""
    rng = random.Random(seed)
    rows = []
    for i, pair in enumerate(instruction_pairs(n, seed)):
        right = pair["completion"].strip()
        endings = [right, right[::-1] + " 0", "1 2", "9 9 9"]
        rng.shuffle(endings)
        ctx_a, ctx_b = pair["prompt"].split(" ", 1)
        rows.append(
            {
                "ind": i, "activity_label": "Reversing", "ctx_a": ctx_a, "ctx_b": ctx_b,
                "ctx": pair["prompt"], "endings": endings, "source_id": f"synthetic~{i}",
                "split": split, "split_type": "indomain", "label": str(endings.index(right)),
            }
        )  # fmt: skip
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def chat_rows(n: int, seed: int = 0, tool_every: int = 3) -> list[dict[str, Any]]:
    """Chat rows; every `tool_every`-th one calls the `reverse` tool and reads its result."""
    rows = []
    for i, pair in enumerate(instruction_pairs(n, seed)):
        digits, answer = pair["prompt"][8:-1], pair["completion"].strip()
        messages: list[dict[str, Any]] = [{"role": "user", "content": pair["prompt"]}]
        if tool_every and i % tool_every == 0:
            call = {
                "type": "function",
                "function": {"name": "reverse", "arguments": {"digits": digits}},
            }
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": answer},
            ]
        messages.append({"role": "assistant", "content": answer})
        rows.append(
            {"messages": messages, "tools": [REVERSE_TOOL]}
            if tool_every and i % tool_every == 0
            else {"messages": messages}
        )
    return rows


def instruction_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`{instruction, output}` rows, AutoModel's local-JSONL example schema."""
    return [
        {"instruction": p["prompt"], "output": p["completion"].strip()}
        for p in instruction_pairs(n, seed)
    ]


def natural_instruction_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`{task_name, id, definition, inputs, targets}` rows (natural-instructions' schema)."""
    return [
        {"task_name": "reverse", "id": f"t-{i}", "definition": "Reverse the digits.",
         "inputs": p["prompt"], "targets": p["completion"].strip()}
        for i, p in enumerate(instruction_pairs(n, seed))
    ]  # fmt: skip
