"""Packing options, THD batch fields, and packed == unpacked through tuneyard's native models.

The equality tests run the same samples once packed into rows and once padded one per row
through the step's own forward (`trainer.forward.model_logits`) in float32: the summed
token loss and every parameter's gradient must agree, and a document's logits in a packed
row must equal its logits alone (no attention across documents).
"""

from __future__ import annotations

import random

import pytest
import torch

from cli.demo_assets import tiny_llama_config
from jobs.recipe.typed import PackedSequence, TargetCall
from trainer import builders
from trainer.data.collate import IGNORE, Collator, PackedDataset, sample_labels
from trainer.data.thd import SEQ_LENS_PAD, document_lengths
from trainer.forward import model_logits
from trainer.loss import MaskedCrossEntropy, token_loss_sum

CPU = torch.device("cpu")


def make_samples(lengths: list[int], seed: int = 0, vocab: int = 512) -> list[dict[str, list]]:
    """Samples whose first third is prompt (no loss) and the rest target."""
    rng = random.Random(seed)
    samples = []
    for n in lengths:
        prompt = max(1, n // 3)
        samples.append(
            {
                "input_ids": [rng.randrange(3, vocab) for _ in range(n)],
                "loss_mask": [0] * prompt + [1] * (n - prompt),
            }
        )
    return samples


def flat_labels(rows: list[dict[str, list]]) -> list[int]:
    return [label for row in rows for label in row["labels"]]


# --- packing options ----------------------------------------------------------------------


def test_greedy_packing_restarts_positions_and_keeps_each_samples_labels() -> None:
    samples = make_samples([3, 2, 4, 5])
    packed = PackedDataset(samples, pack_size=6)
    assert [len(r["input_ids"]) for r in packed] == [5, 4, 5]
    assert packed[0]["position_ids"] == [0, 1, 2, 0, 1]
    expected = [x for s in samples for x in sample_labels(s["input_ids"], s["loss_mask"])]
    assert flat_labels(list(packed)) == expected


def test_a_long_sample_is_truncated_by_default_and_dropped_with_drop_long_samples() -> None:
    samples = make_samples([3, 9, 3])
    truncated = PackedDataset(samples, pack_size=6)
    assert [len(r["input_ids"]) for r in truncated] == [3, 6, 3]
    assert truncated[1]["input_ids"] == samples[1]["input_ids"][:6]
    assert truncated[1]["labels"][-1] == IGNORE  # its target was cut off
    assert truncated.dropped == 0

    dropped = PackedDataset(samples, pack_size=6, drop_long_samples=True)
    assert dropped.dropped == 1
    assert [r["input_ids"] for r in dropped] == [samples[0]["input_ids"] + samples[2]["input_ids"]]


def test_split_across_pack_fills_rows_and_keeps_labels_exact_across_the_split() -> None:
    samples = make_samples([4, 5, 14, 2], seed=3)
    packed = PackedDataset(samples, pack_size=6, split_across_pack=True)
    assert [len(r["input_ids"]) for r in packed] == [6, 6, 6, 6, 1]
    expected = [x for s in samples for x in sample_labels(s["input_ids"], s["loss_mask"])]
    assert flat_labels(list(packed)) == expected
    assert [t for r in packed for t in r["input_ids"]] == [
        t for s in samples for t in s["input_ids"]
    ]
    # row 0 ends with the first two tokens of sample 1; its last label is sample 1's third
    # token (a target), which sits at the start of row 1
    assert packed[0]["labels"][-1] == samples[1]["input_ids"][2]
    assert packed[1]["position_ids"] == [0, 1, 2, 0, 1, 2]  # continuation, then sample 2
    assert packed[2]["position_ids"] == list(range(6))  # the middle of sample 2
    assert document_lengths(packed[3]["position_ids"]) == [5, 1]


def test_split_wins_over_truncation_but_drop_long_samples_wins_over_split() -> None:
    samples = make_samples([3, 9])
    both = PackedDataset(samples, pack_size=6, split_across_pack=True, drop_long_samples=True)
    assert [r["input_ids"] for r in both] == [samples[0]["input_ids"]]


@pytest.mark.parametrize("split", [False, True])
def test_max_packs_stops_after_that_many_rows(split: bool) -> None:
    samples = make_samples([5] * 10)
    packed = PackedDataset(samples, pack_size=6, max_packs=3, split_across_pack=split)
    assert len(packed) == 3
    assert all(len(r["input_ids"]) == (6 if split else 5) for r in packed)
    assert len(PackedDataset(samples, pack_size=6, max_packs=100)) == 10


def test_build_dataset_hands_every_packing_option_to_the_packer(monkeypatch) -> None:
    samples = make_samples([4, 9, 3, 5, 5])
    monkeypatch.setattr(builders, "build_target", lambda call, loc, **kw: samples)
    spec = PackedSequence(True, 6, split_across_pack=False, max_packs=2, drop_long_samples=True)
    dataset = builders.build_dataset(TargetCall("any"), "dataset", spec, tokenizer=None)
    assert isinstance(dataset, PackedDataset) and dataset.dropped == 1 and len(dataset) == 2
    split = PackedSequence(True, 6, split_across_pack=True, max_packs=None)
    dataset = builders.build_dataset(TargetCall("any"), "dataset", split, tokenizer=None)
    assert [len(r["input_ids"]) for r in dataset] == [6, 6, 6, 6, 2]


# --- THD fields ---------------------------------------------------------------------------


def test_thd_fields_pad_seq_lens_and_cu_seqlens_as_automodel_does() -> None:
    rows = list(PackedDataset(make_samples([3, 2, 4, 1, 2]), pack_size=6))
    assert [document_lengths(r["position_ids"]) for r in rows] == [[3, 2], [4, 1], [2]]
    batch = Collator(0, packed=True, pad_to=8)(rows)
    assert batch["input_ids"].shape == (3, 8)
    assert batch["seq_lens"].tolist() == [[3, 2], [4, 1], [2, SEQ_LENS_PAD]]
    assert batch["seq_lens_padded"].tolist() == [[3, 5], [4, 4], [8, SEQ_LENS_PAD]]
    assert batch["cu_seqlens"].tolist() == [[0, 3, 8], [0, 4, 8], [0, 8, SEQ_LENS_PAD]]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert "attention_mask" not in batch and batch["num_tokens"] == 12
    assert batch["labels"][0, 5:].tolist() == [IGNORE] * 3  # the tail pad has no loss


def test_thd_fields_follow_the_collated_length_under_pad_to_multiple_of() -> None:
    rows = list(PackedDataset(make_samples([3, 2, 3]), pack_size=5))
    batch = Collator(0, packed=True, pad_to_multiple_of=4)(rows)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["cu_seqlens"].tolist() == [[0, 3, 8], [0, 8, SEQ_LENS_PAD]]
    assert (batch["seq_lens_padded"].clamp(min=0).sum(1) == 8).all()


# --- packed == unpacked through native models ---------------------------------------------


def qwen3_tiny_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


CONFIGS = {"llama": tiny_llama_config, "qwen3": qwen3_tiny_config}


def native_model(family: str) -> torch.nn.Module:
    from models.auto import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[family](), dtype="float32")
    assert type(model).__module__ == f"models.{family}.model"  # tuneyard's own, not HF's
    return model


def loss_and_grads(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits = model_logits(model, batch, CPU)  # the step's forward: picks the model's keys
    loss = token_loss_sum(MaskedCrossEntropy(), logits, batch["labels"])
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return loss.detach(), grads


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_packed_loss_and_gradients_equal_unpacked(family: str) -> None:
    model = native_model(family)
    samples = make_samples([5, 17, 3, 30, 9, 12, 2, 21], seed=1)
    rows = list(PackedDataset(samples, pack_size=32))
    assert len(rows) < len(samples) and any(
        len(document_lengths(r["position_ids"])) > 2 for r in rows
    )
    packed = Collator(0, packed=True)(rows)
    padded = Collator(0)(samples)
    assert int((packed["labels"] != IGNORE).sum()) == int((padded["labels"] != IGNORE).sum())

    packed_loss, packed_grads = loss_and_grads(model, packed)
    padded_loss, padded_grads = loss_and_grads(model, padded)
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=1e-5)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for g in padded_grads.values())


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_document_in_a_packed_row_sees_only_itself(family: str) -> None:
    model = native_model(family).eval()
    first, second, third = make_samples([6, 5, 4], seed=2)
    batch = Collator(0, packed=True, pad_to=20)(list(PackedDataset([first, second, third], 20)))
    with torch.no_grad():
        together = model_logits(model, batch, CPU)[0]
        alone = model(input_ids=torch.tensor([second["input_ids"]]), use_cache=False).logits[0]
        unmasked = model(input_ids=batch["input_ids"], use_cache=False).logits[0]
    torch.testing.assert_close(together[6:11], alone, rtol=1e-5, atol=1e-5)
    # without the position ids the same row would attend across documents
    assert not torch.allclose(unmasked[6:11], alone, rtol=1e-3, atol=1e-3)
