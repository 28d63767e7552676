"""Data order is part of the resume state, for every dataset kind.

For each kind (map-style instruction and chat data, packed rows, the deterministic mock
"iterable", nanoGPT shards, Megatron indexed files) a fresh process's datasets, loader and
sampler, given the position a checkpoint records (epoch, batches done), yield exactly the
batches an uninterrupted run would have seen next, across an epoch boundary, on each of
two data-parallel ranks. The killed-and-resumed torchrun runs (`test_resume.py`,
`test_pretrain_datasets_run.py`) check the same end to end for SQuAD and Megatron.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from sft_fixtures import TOOL_TEMPLATE, chat_rows, hellaswag_rows, write_jsonl, write_parquet
from token_corpora import counting_documents, write_megatron, write_nanogpt_shard

from jobs.recipe.typed import DataLoader as LoaderSpec
from trainer.builders import build_loader
from trainer.data.collate import Collator, PackedDataset

SPEC = LoaderSpec(batch_size=2, num_workers=0, shuffle=True, drop_last=True, pin_memory=False,
                  persistent_workers=False, collate_fn=None)  # fmt: skip


def _hellaswag(root: Path, tok: Any) -> Any:
    from trainer.data.hellaswag import HellaSwag

    return HellaSwag(str(write_parquet(root / "hs.parquet", hellaswag_rows(24))), tok)


def _packed_hellaswag(root: Path, tok: Any) -> Any:
    return PackedDataset(_hellaswag(root, tok), 48)


def _chat(root: Path, tok: Any) -> Any:
    from trainer.data.chat import ChatDataset

    path = write_jsonl(root / "chat.jsonl", chat_rows(24))
    return ChatDataset(str(path), tok, chat_template=TOOL_TEMPLATE)


def _mock(root: Path, tok: Any) -> Any:
    from trainer.data.mock import MockIterableDataset

    return MockIterableDataset(vocab_size=97, seq_length=16, num_samples=24, seed=3)


def _nanogpt(root: Path, tok: Any) -> Any:
    from trainer.data.nanogpt import NanogptDataset

    for shard in range(2):
        tokens = [t for d in counting_documents(8, 40, start=shard * 320) for t in d]
        write_nanogpt_shard(root / f"shard_{shard}.bin", tokens)
    return NanogptDataset(str(root / "shard_*.bin"), seq_length=15)


def _megatron(root: Path, tok: Any) -> Any:
    from trainer.data.megatron import MegatronPretraining

    prefix = write_megatron(root / "web_text_document", counting_documents(40, 33))
    return MegatronPretraining(str(prefix), seq_length=16, split="100,0,0", seed=5,
                               num_train_samples=40, index_mapping_dir=str(root / "idx"))  # fmt: skip


KINDS: dict[str, Callable[[Path, Any], Any]] = {
    "hellaswag": _hellaswag,
    "packed": _packed_hellaswag,
    "chat": _chat,
    "mock_iterable": _mock,
    "nanogpt": _nanogpt,
    "megatron": _megatron,
}


def _loader(dataset: Any, rank: int) -> Any:
    return build_loader(dataset, SPEC, seed=11, dp_rank=rank, dp_size=2,
                        collator=Collator(0, packed=True), train=True)  # fmt: skip


def _stream(loader: Any, state: dict[str, int], count: int) -> list[torch.Tensor]:
    """`count` batches from `state` on, crossing epochs as the step loop does."""
    sampler, out = loader.batch_sampler, []
    state = dict(state)
    while len(out) < count:
        sampler.load_state_dict(state)
        for batch in loader:
            out.append(batch["input_ids"])
            state["batches_done"] += 1
            if len(out) == count:
                return out
        state = {"epoch": state["epoch"] + 1, "batches_done": 0}
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("rank", [0, 1])
def test_a_restarted_loader_continues_on_the_next_unseen_batch(kind, rank, tmp_path, tok):
    clean_loader = _loader(KINDS[kind](tmp_path, tok), rank)
    per_epoch = len(clean_loader.batch_sampler)
    assert per_epoch >= 2, f"{kind}: too little data for an epoch of 2+ batches"
    total = per_epoch + 3  # past one epoch boundary
    clean = _stream(clean_loader, {"epoch": 0, "batches_done": 0}, total)
    cut = per_epoch - 1  # killed one batch before the epoch ends
    restarted = _loader(KINDS[kind](tmp_path, tok), rank)  # a new process rebuilds it all
    resumed = _stream(restarted, {"epoch": 0, "batches_done": cut}, total - cut)
    for i, (want, got) in enumerate(zip(clean[cut:], resumed, strict=True)):
        assert torch.equal(want, got), f"{kind}: batch {cut + i} differs after the resume"
    assert not torch.equal(clean[0], clean[per_epoch]), f"{kind}: epochs are not reshuffled"
