"""Worker for test_phi3_tp: two gloo ranks shard tiny Phi-3 models and compare to one process.

`python _phi3_worker.py RANK WORLD PORT OUT CASE...`. `trainer_tp:VARIANT:SP:TIED` runs the
trainer's `parallelize` (the registry row's plan: tensor parallelism, then FSDP2) through
`_tp_worker.check_trainer_tp` with a Phi-3 config; `plan:VARIANT:SP` applies `hooks.tp_plan`
alone and runs a left-padded batch longer than longrope's original length, so the long
factors, partial rotary and the sliding window run sharded. Logits, loss and every
gradient must equal the unsharded model's. One line per case goes to OUT.rank.
"""

from __future__ import annotations

import _tp_worker
import torch
import torch.distributed as dist
from gloo_cases import run_cases
from phi3_tiny import ORIGINAL, phi3_config

VOCAB = 512  # _tp_worker draws token ids below 512


def _phi3_family_config(variant: str, tied: bool):
    return phi3_config(variant, vocab_size=VOCAB, tie_word_embeddings=tied)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def check_plan(variant: str, sequence_parallel: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from models import AutoModelForCausalLM
    from models.hooks import tp_plan

    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(_phi3_family_config(variant, False))
    sharded = AutoModelForCausalLM.from_config(_phi3_family_config(variant, False))
    sharded.load_state_dict(reference.state_dict())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(sharded, mesh, tp_plan(sharded, sequence_parallel=sequence_parallel))
    assert _full(sharded.model.layers[0].self_attn.k_proj.weight).shape == (32, 64)
    assert sharded.model.layers[0].self_attn.k_proj.weight.to_local().shape == (16, 64)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, ORIGINAL + 8))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    labels = ids.masked_fill(mask == 0, -100)
    ref = reference(input_ids=ids, attention_mask=mask, labels=labels)
    out = sharded(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(_full(out.logits), ref.logits, atol=1e-5, rtol=1e-5)
    ref.loss.backward()
    out.loss.backward()
    grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in sharded.named_parameters():
        torch.testing.assert_close(_full(param.grad), grads[name], atol=1e-5, rtol=1e-4, msg=name)


def run_case(case: str) -> None:
    kind, variant, *flags = case.split(":")
    if kind == "trainer_tp":
        _tp_worker.family_config = _phi3_family_config
        _tp_worker.check_trainer_tp(variant, "native", flags[0] == "1", flags[1] == "1")
    else:
        check_plan(variant, flags[0] == "1")


if __name__ == "__main__":
    run_cases(run_case)
