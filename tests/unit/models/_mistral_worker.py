"""Worker for test_mistral_distributed: two gloo ranks shard tiny Mistral / Mixtral models.

`python _mistral_worker.py RANK WORLD PORT OUT CASE...` runs each case and writes one line
per case, "CASE ok" or "CASE FAILED <traceback>", to OUT.rank.
`tp:SP:TIED`: the trainer's `parallelize` with tp_size 2 on native Mistral (padded inputs
longer than the sliding window); logits, loss and every gradient equal the unsharded model's.
`ep_hooks` / `ep_trainer`: `_ep_worker`'s expert-parallel checks on a tiny Mixtral: its
experts spread over 2 ranks, alone through `models.hooks.apply_expert_parallel` or with
FSDP2 through the trainer's `parallelize`; the ranks hold batches of different token
counts and the reference is the unsharded model on both.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _ep_worker import _full, check_hooks, check_trainer
from gloo_cases import run_cases
from layouts import layout
from mistral_family_configs import VOCAB, make_family_config


def _pair(family: str, **overrides):
    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    config = make_family_config(family, **overrides)
    reference = AutoModelForCausalLM.from_config(config)
    sharded = AutoModelForCausalLM.from_config(config)
    assert sharded.tuneyard_backend == "native"
    sharded.load_state_dict(reference.state_dict())
    return reference, sharded


def _trainer_topology(distributed: dict):
    from trainer.distributed import DistEnv, build_mesh

    rank = dist.get_rank()
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    return build_mesh(env, layout(distributed, 2)), env.device


def _assert_grads_equal(model, ref_grads) -> None:
    for name, param in model.named_parameters():
        torch.testing.assert_close(
            _full(param.grad), ref_grads[name], atol=1e-5, rtol=1e-4, msg=name
        )


def check_tp(sequence_parallel: bool, tied: bool) -> None:
    from trainer.parallelize import parallelize

    reference, sharded = _pair("mistral", tie_word_embeddings=tied)
    distributed = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": sequence_parallel}
    topology, device = _trainer_topology(distributed)
    model = parallelize(sharded, topology, layout(distributed, 2), device, None)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 16))  # 16 > sliding_window 6
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ref_out = reference(input_ids=ids, attention_mask=mask, labels=ids)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    torch.testing.assert_close(_full(out.logits), ref_out.logits, atol=1e-5, rtol=1e-5)
    ref_out.loss.backward()
    out.loss.backward()
    _assert_grads_equal(sharded, {n: p.grad for n, p in reference.named_parameters()})


def _mixtral_pair():
    return _pair("mixtral", vocab_size=512)  # the `_ep_worker` batches draw ids below 512


def run_case(case: str) -> None:
    kind, *args = case.split(":")
    if kind == "tp":
        check_tp(args[0] == "1", args[1] == "1")
    else:
        {"ep_hooks": check_hooks, "ep_trainer": check_trainer}[kind](_mixtral_pair)


if __name__ == "__main__":
    run_cases(run_case)
