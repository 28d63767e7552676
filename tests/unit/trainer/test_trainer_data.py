"""Datasets, collation (label shifting, packing) and the resumable sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli.demo_assets import write_instruction_jsonl, write_squad_dir
from jobs.recipe.exit_codes import ExitCode
from trainer.data.collate import Collator, PackedDataset, shifted_labels
from trainer.data.datasets import (
    JsonlInstructionDataset,
    MockDataset,
    SquadDataset,
    TextDataset,
    join_prompt_and_target,
)
from trainer.data.sampler import ResumableBatchSampler
from trainer.errors import TrainerError


def test_prompt_completion_masks_the_prompt(tokenizer, tmp_path: Path) -> None:
    data = write_instruction_jsonl(tmp_path / "d.jsonl", 4)
    sample = JsonlInstructionDataset(tokenizer, str(data))[0]
    first = json.loads(data.read_text().splitlines()[0])
    target = tokenizer.decode(
        [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m]
    )
    assert target == first["completion"] + tokenizer.eos_token
    assert sample["input_ids"][0] == tokenizer.bos_token_id and sample["loss_mask"][0] == 0


def test_chat_messages_take_loss_on_assistant_turns_only(tokenizer, tmp_path: Path) -> None:
    messages = [
        {"role": "user", "content": "Reverse 12:"},
        {"role": "assistant", "content": " 2 1"},
    ]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    sample = JsonlInstructionDataset(tokenizer, str(tmp_path / "chat.jsonl"))[0]
    learned = tokenizer.decode(
        [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m]
    )
    assert learned == " 2 1<|end|>"
    assert tokenizer.decode(sample["input_ids"]).startswith("<|user|>Reverse 12:")


def test_squad_dir_split_and_answer_only_loss(tokenizer, tmp_path: Path) -> None:
    squad = write_squad_dir(tmp_path / "squad", n=8)
    train = SquadDataset(tokenizer, str(squad), split="train", limit_dataset_samples=5)
    val = SquadDataset(tokenizer, str(squad), split="validation")
    assert len(train) == 5 and len(val) == 8
    sample = train[0]
    answer = tokenizer.decode(
        [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m]
    )
    assert answer.strip().removesuffix(tokenizer.eos_token) in {
        "Paris",
        "Lima",
        "Oslo",
        "Quito",
        "Accra",
        "Hanoi",
    }


def test_squad_with_a_chat_template_renders_a_user_turn_and_the_answer_turn(
    tokenizer, tmp_path: Path
) -> None:
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    squad = write_squad_dir(tmp_path / "squad", n=4)
    example = json.loads((squad / "train.json").read_text())["data"][0]["paragraphs"][0]
    qa = example["qas"][0]
    sample = SquadDataset(tokenizer, str(squad), chat_template=template)[0]
    ids, mask = sample["input_ids"], sample["loss_mask"]
    target = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert target == f"{qa['answers'][0]['text']}<|end|>"
    user = f"Context: {example['context']} Question: {qa['question']} Answer: "
    assert context == f"<|user|>{user}<|end|><|assistant|>"
    cut = SquadDataset(tokenizer, str(squad), max_seq_length=12, chat_template=template)[0]
    assert len(cut["input_ids"]) == 12 and cut["input_ids"][-sum(mask) :] == ids[-sum(mask) :]


def test_truncation_keeps_the_target() -> None:
    sample = join_prompt_and_target([1, 2, 3, 4, 5], [8, 9], max_len=4)
    assert sample == {"input_ids": [4, 5, 8, 9], "loss_mask": [0, 0, 1, 1]}


def test_text_dataset_chunks_the_stream(tokenizer, tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("Reverse 123 now.\n\nAnother document here.")
    dataset = TextDataset(tokenizer, str(tmp_path / "t.txt"), seq_length=4)
    assert all(len(s["input_ids"]) <= 4 and all(s["loss_mask"]) for s in dataset)
    assert sum(len(s["input_ids"]) for s in dataset) >= 8


def test_mock_dataset_is_reproducible() -> None:
    a, b = MockDataset(100, 8, num_samples=4, seed=3), MockDataset(100, 8, num_samples=4, seed=3)
    assert a[2] == b[2] and a[1] != a[2] and len(a) == 4
    assert max(a[0]["input_ids"]) < 100


@pytest.mark.parametrize(
    "content, words",
    [
        (None, ["does not exist"]),
        ('{"prompt": "x", "completion": "y"}\nnot json\n', ["d.jsonl:2", "not valid JSON"]),
        ('{"text": "x"}\n', ["d.jsonl:1", "'prompt'", "'messages'"]),
    ],
)
def test_bad_files_are_data_errors(tokenizer, tmp_path: Path, content, words) -> None:
    path = tmp_path / "d.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TrainerError) as info:
        JsonlInstructionDataset(tokenizer, str(path))
    assert info.value.exit_code == ExitCode.DATA_ERROR
    assert all(w in info.value.message for w in words)


def test_labels_are_shifted_and_stop_at_sample_boundaries() -> None:
    ids, mask, positions = [10, 11, 12, 20, 21, 22], [0, 1, 1, 0, 1, 1], [0, 1, 2, 0, 1, 2]
    assert shifted_labels(ids, mask, positions) == [11, 12, -100, 21, 22, -100]


def test_padding_collator_masks_padding() -> None:
    batch = Collator(pad_token_id=0)(
        [
            {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
            {"input_ids": [8, 9], "loss_mask": [0, 1]},
        ]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["labels"].tolist() == [[6, 7, -100], [9, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["num_tokens"] == 5


def test_packing_resets_positions_and_pads_the_tail() -> None:
    samples = [
        {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
        {"input_ids": [4, 5], "loss_mask": [0, 1]},
        {"input_ids": [6, 7, 8, 9], "loss_mask": [0, 0, 1, 1]},
    ]
    packed = PackedDataset(samples, pack_size=6)
    assert len(packed) == 2
    batch = Collator(0, packed=True, pad_to=6)([packed[0], packed[1]])
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert batch["labels"].tolist() == [[2, 3, -100, 5, -100, -100], [-100, 8, 9, -100, -100, -100]]
    assert "attention_mask" not in batch and batch["num_tokens"] == 9


def test_packed_rows_do_not_attend_across_samples(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    a, b = [1, 40, 41, 42], [1, 50, 51]
    packed = Collator(0, packed=True)(
        list(
            PackedDataset(
                [{"input_ids": a, "loss_mask": [1] * 4}, {"input_ids": b, "loss_mask": [1] * 3}], 8
            )
        )
    )
    with torch.no_grad():
        together = model(
            input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False
        ).logits[0]
        alone = model(input_ids=torch.tensor([b]), use_cache=False).logits[0]
    torch.testing.assert_close(together[4:7], alone, atol=1e-5, rtol=1e-5)


def test_sampler_partitions_ranks_and_resumes_mid_epoch() -> None:
    ranks = [ResumableBatchSampler(20, 3, r, 2, shuffle=True, seed=1) for r in range(2)]
    seen = [i for s in ranks for batch in s for i in batch]
    assert len(seen) == len(set(seen)) == 18 and len(ranks[0]) == 3
    full = list(ranks[0])
    resumed = ResumableBatchSampler(20, 3, 0, 2, shuffle=True, seed=1)
    resumed.load_state_dict({"epoch": 0, "batches_done": 2})
    assert list(resumed) == full[2:]
    resumed.load_state_dict({"epoch": 1, "batches_done": 0})
    assert list(resumed) != full


def test_starting_a_loader_does_not_draw_from_the_global_rng() -> None:
    from jobs.recipe.typed import DataLoader as LoaderSpec
    from trainer.builders import build_loader

    samples = [{"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]}] * 8
    spec = LoaderSpec(2, 0, True, False, False, False, None)
    loader = build_loader(
        samples, spec, seed=0, dp_rank=0, dp_size=1, collator=Collator(0), train=True
    )
    torch.manual_seed(123)
    before = torch.get_rng_state()
    next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before)
