"""The datasets a recipe's `dataset` / `validation_dataset` sections can name.

Each is a map-style dataset whose items are `{"input_ids": [...], "loss_mask": [...]}`:
`loss_mask[t]` is 1 when token t is a target (answer, completion, assistant turn or every
token of plain text). The collator turns this into shifted labels. A path field names a
local file (or, for SQuAD, a directory) or, when no such path exists, a Hugging Face hub
dataset `org/name` read through `trainer.data.hub` (its `split`; `train` for the datasets
that take no split). A missing or malformed file or row raises `TrainerError(DATA_ERROR)`
naming the file or dataset, the line and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from trainer.data.chat import render_chat, require_chat_template
from trainer.data.hub import is_hub_dataset, load_hub_rows
from trainer.errors import data_error

Sample = dict[str, list[int]]


def _existing_file(path: str | Path, what: str) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise data_error(f"{what}: data file {file} does not exist; check the path in the recipe")
    return file


def _read_jsonl(file: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise data_error(f"{file}:{number}: not valid JSON ({exc.msg})") from None
    return rows


def _read_rows(path: str, limit: int | None) -> tuple[list[dict[str, Any]], str]:
    """JSONL rows of a local file or the `train` rows of a hub dataset, and their source's name."""
    if is_hub_dataset(path):
        return load_hub_rows(path, "train", limit), f"{path}[train]"
    file = _existing_file(path, "dataset")
    return _limit(_read_jsonl(file), limit), str(file)


def _bos(tokenizer: Any) -> list[int]:
    return [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []


def _eos(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def join_prompt_and_target(prompt: list[int], target: list[int], max_len: int | None) -> Sample:
    """Concatenate; when too long, drop prompt tokens from the left so the target survives."""
    if max_len is not None and len(prompt) + len(target) > max_len:
        keep = max(0, max_len - len(target))
        prompt = prompt[len(prompt) - keep :] if keep else []
        target = target[:max_len]
    return {"input_ids": prompt + target, "loss_mask": [0] * len(prompt) + [1] * len(target)}


def _limit(rows: list[Any], limit: int | None) -> list[Any]:
    return rows[:limit] if limit is not None else rows


class _ListDataset(Dataset):
    samples: list[Sample]
    row_ids: list[Any] | None = None  # the source's own `id` column, where it has one

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index]


class SquadDataset(_ListDataset):
    """SQuAD v1 JSON (`data[].paragraphs[].qas[]`) or JSONL of {context, question, answers}.

    Plain `Context: ... Question: ... Answer:` prompts; with `chat_template` (the text) a
    user turn and the answer as the assistant's turn, rendered with that template."""

    def __init__(
        self,
        tokenizer: Any,
        path_or_dataset: str,
        split: str = "train",
        max_seq_length: int | None = None,
        limit_dataset_samples: int | None = None,
        tokenizer_name_or_path: str | None = None,
        padding: bool | str = False,  # AutoModel's: batches pad to their longest sample here
        truncation: bool | str = False,  # samples are cut to max_seq_length whenever it is set
        fp8: bool = False,  # AutoModel pads to multiples of 16 for fp8; fp8 is refused here
        start_of_turn_token: str | None = None,  # the answer's first token is known exactly
        chat_template: str | None = None,
    ):
        if chat_template is not None:
            require_chat_template(tokenizer, chat_template, "dataset")
        if is_hub_dataset(path_or_dataset):
            source = f"{path_or_dataset}[{split}]"
            rows = load_hub_rows(path_or_dataset, split, limit_dataset_samples)
        else:
            file = self._find_file(Path(path_or_dataset).expanduser(), split)
            source, rows = str(file), self._read_examples(file)
        examples = _limit(self._checked(rows, source), limit_dataset_samples)
        if chat_template is None:
            self.samples = [self._tokenize(tokenizer, ex, max_seq_length) for ex in examples]
        else:
            self.samples = [
                _squad_chat(tokenizer, ex, max_seq_length, f"{source}: example {number}")
                for number, ex in enumerate(examples, start=1)
            ]

    @staticmethod
    def _find_file(path: Path, split: str) -> Path:
        if path.is_dir():
            for name in (f"{split}.json", f"{split}.jsonl"):
                if (path / name).is_file():
                    return path / name
            raise data_error(f"dataset: {path} holds no {split}.json or {split}.jsonl")
        return _existing_file(path, "dataset")

    @staticmethod
    def _read_examples(file: Path) -> list[dict[str, Any]]:
        if file.suffix == ".jsonl":
            rows = _read_jsonl(file)
        else:
            try:
                doc = json.loads(file.read_text())
            except json.JSONDecodeError as exc:
                raise data_error(f"{file}: not valid JSON ({exc.msg})") from None
            rows = [
                {"context": para["context"], **qa}
                for article in doc.get("data", [])
                for para in article.get("paragraphs", [])
                for qa in para.get("qas", [])
            ]
        return rows

    @staticmethod
    def _checked(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        for number, row in enumerate(rows, start=1):
            if not row.get("question") or not _answer_texts(row.get("answers")):
                raise data_error(f"{source}: example {number} has no question or no answers")
        return rows

    @staticmethod
    def _tokenize(tokenizer: Any, ex: dict[str, Any], max_len: int | None) -> Sample:
        answer = _answer_texts(ex["answers"])[0]
        prompt = f"Context: {ex.get('context', '')} Question: {ex['question']} Answer:"
        prompt_ids = _bos(tokenizer) + _encode(tokenizer, prompt)
        return join_prompt_and_target(
            prompt_ids, _encode(tokenizer, " " + answer) + _eos(tokenizer), max_len
        )


def _squad_chat(tokenizer: Any, ex: dict[str, Any], max_len: int | None, where: str) -> Sample:
    """An example as a user turn (context and question) and the assistant's answer, rendered
    with the chat template; the loss on what the answer turn adds. Too long: prompt tokens
    are dropped from the left, as for plain examples, so the answer survives."""
    user = f"Context: {ex.get('context') or ''} Question: {ex['question']} Answer: "
    messages = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": _answer_texts(ex["answers"])[0].strip()},
    ]
    sample = render_chat(tokenizer, messages, None, where)
    ids, mask = sample["input_ids"], sample["loss_mask"]
    start = mask.index(1) if 1 in mask else len(mask)
    if max_len is not None and len(ids) > max_len:
        drop = min(start, len(ids) - max_len)
        ids, mask = ids[drop:][:max_len], mask[drop:][:max_len]
    return {"input_ids": ids, "loss_mask": mask}


def _answer_texts(answers: Any) -> list[str]:
    """Answer texts of SQuAD JSON (`[{text, answer_start}]`) or hub rows (`{text: [...]}`)."""
    if isinstance(answers, dict):
        return list(answers.get("text") or [])
    return [a["text"] for a in answers or [] if isinstance(a, dict) and "text" in a]


class JsonlInstructionDataset(_ListDataset):
    """JSONL rows with prompt/completion fields, or chat `messages` (loss on assistant turns)."""

    def __init__(
        self,
        tokenizer: Any,
        path: str,
        max_seq_length: int | None = None,
        prompt_field: str = "prompt",
        completion_field: str = "completion",
        messages_field: str = "messages",
        limit_dataset_samples: int | None = None,
        tokenizer_name_or_path: str | None = None,
    ):
        rows, source = _read_rows(path, limit_dataset_samples)
        self.samples = []
        for number, row in enumerate(rows, start=1):
            if messages_field in row:
                sample = chat_sample(tokenizer, row[messages_field], max_seq_length)
            elif prompt_field in row and completion_field in row:
                prompt = _bos(tokenizer) + _encode(tokenizer, str(row[prompt_field]))
                target = _encode(tokenizer, str(row[completion_field])) + _eos(tokenizer)
                sample = join_prompt_and_target(prompt, target, max_seq_length)
            else:
                raise data_error(
                    f"{source}:{number}: needs '{prompt_field}' and '{completion_field}' "
                    f"fields or a '{messages_field}' list"
                )
            self.samples.append(sample)
        if any("id" in row for row in rows):
            self.row_ids = [row.get("id") for row in rows]


def chat_sample(tokenizer: Any, messages: list[dict[str, str]], max_len: int | None) -> Sample:
    """Render with the chat template turn by turn; loss on what each assistant turn adds."""
    if not getattr(tokenizer, "chat_template", None):
        raise data_error("dataset: chat `messages` need a tokenizer with a chat_template")
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            prefix = tokenizer.apply_chat_template(
                messages[:i], tokenize=False, add_generation_prompt=True
            )
            if prefix.startswith(rendered):
                ids += _encode(tokenizer, prefix[len(rendered) :])
                mask += [0] * (len(ids) - len(mask))
                rendered = prefix
        full = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        piece = _encode(tokenizer, full[len(rendered) :])
        ids += piece
        mask += [1 if message.get("role") == "assistant" else 0] * len(piece)
        rendered = full
    if max_len is not None:
        ids, mask = ids[:max_len], mask[:max_len]
    return {"input_ids": ids, "loss_mask": mask}


class TextDataset(_ListDataset):
    """Plain text (or JSONL with a `text` field) for pre-training: concatenate, then chunk."""

    def __init__(
        self, tokenizer: Any, path: str, seq_length: int, tokenizer_name_or_path: str | None = None
    ):
        docs, source = self._read_docs(path)
        stream: list[int] = []
        for doc in docs:
            if doc.strip():
                stream += _encode(tokenizer, doc) + _eos(tokenizer)
        chunks = [stream[i : i + seq_length] for i in range(0, len(stream), seq_length)]
        self.samples = [{"input_ids": c, "loss_mask": [1] * len(c)} for c in chunks if len(c) > 1]
        if not self.samples:
            raise data_error(f"{source}: no text to train on")

    @staticmethod
    def _read_docs(path: str) -> tuple[list[str], str]:
        """Documents: blank-line separated text, or the `text` field of JSONL or hub rows."""
        if is_hub_dataset(path) or Path(path).suffix == ".jsonl":
            rows, source = _read_rows(path, None)
            return [str(row.get("text", "")) for row in rows], source
        file = _existing_file(path, "dataset")
        return file.read_text().split("\n\n"), str(file)


class MockDataset(Dataset):
    """Random tokens, reproducible per index; for benchmarks (nothing to learn)."""

    def __init__(self, vocab_size: int, seq_length: int, num_samples: int = 1024, seed: int = 0):
        self.vocab_size, self.seq_length = vocab_size, seq_length
        self.num_samples, self.seed = num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> Sample:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        ids = torch.randint(0, self.vocab_size, (self.seq_length,), generator=generator)
        return {"input_ids": ids.tolist(), "loss_mask": [1] * self.seq_length}
