"""Worker for test_gpt_oss_expert_parallel: two gloo ranks spread a tiny gpt-oss's experts.

`python _gpt_oss_worker.py RANK WORLD PORT OUT CASE...` (through `gloo_cases.run_cases`).
The ranks hold batches of different token counts; the reference is the unsharded model
on both batches, with the loss helpers of `_ep_worker`. `hooks`: `models.hooks.
apply_expert_parallel` alone (4 expert tensors per layer, biases included, 2 of 4 experts
per rank); logits equal, summed losses equal the reference loss, and every gradient
(summed over ranks for the replicated parameters, gathered for the experts) equals the
reference's. `trainer`: `trainer.parallelize.parallelize` with ep_size 2 (experts plus
FSDP2 on the rest) and the trainer's loss scaling; every gradient and the clipped
gradient norm equal the reference's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _ep_worker import _full, ce_sum, reference_grads
from gloo_cases import run_cases
from gpt_oss_tiny import VOCAB, seeded_hf_model
from layouts import layout
from torch.distributed.tensor import DTensor

from models import AutoModelForCausalLM

GRAD = dict(atol=1e-5, rtol=1e-4)


def build_pair():
    """The reference and the model to shard: the same seeded weights, native class."""
    hf = seeded_hf_model()
    config = hf.config
    reference = AutoModelForCausalLM.from_config(config)
    state = reference.state_dict_adapter.from_hf(hf.state_dict(), config)
    reference.load_state_dict(state)
    ep_model = AutoModelForCausalLM.from_config(config)
    ep_model.load_state_dict(reference.state_dict())
    return reference, ep_model


def batches() -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randint(1, VOCAB, (2, 12)), torch.randint(1, VOCAB, (3, 7))]


def check_hooks() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from models.hooks import apply_expert_parallel

    reference, ep_model = build_pair()
    rank, data = dist.get_rank(), batches()
    ref_logits, ref_loss, ref_grads, total = reference_grads(reference, data, 1.0)
    params = apply_expert_parallel(ep_model, init_device_mesh("cpu", (2,)))
    assert len(params) == 8 and all(p.to_local().shape[0] == 2 for p in params)
    logits = ep_model(input_ids=data[rank]).logits
    torch.testing.assert_close(logits, ref_logits[rank], atol=1e-5, rtol=1e-5)
    loss = ce_sum(logits, data[rank]) / total
    loss.backward()
    summed = loss.detach().clone()
    dist.all_reduce(summed)
    torch.testing.assert_close(summed, ref_loss.detach(), atol=1e-5, rtol=1e-5)
    for name, param in ep_model.named_parameters():
        grad = param.grad
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        else:
            dist.all_reduce(grad)
        assert ref_grads[name].abs().sum() > 0, name  # every parameter takes part
        torch.testing.assert_close(grad, ref_grads[name], **GRAD, msg=name)


def check_trainer() -> None:
    from trainer.distributed import DistEnv, build_mesh
    from trainer.parallelize import clip_grad_norm, parallelize

    reference, ep_model = build_pair()
    rank, data = dist.get_rank(), batches()
    ref_logits, _, ref_grads, total = reference_grads(reference, data, 1.0)
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    distributed = {"strategy": "fsdp2", "ep_size": 2}
    topology = build_mesh(env, layout(distributed, 2))
    assert topology.ep_size == 2 and topology.dp_size == 2
    model = parallelize(ep_model, topology, distributed, env.device, None)
    logits = model(input_ids=data[rank]).logits
    torch.testing.assert_close(logits, ref_logits[rank], atol=1e-5, rtol=1e-5)
    (ce_sum(logits, data[rank]) * topology.dp_size / total).backward()
    for name, param in ep_model.named_parameters():
        torch.testing.assert_close(_full(param.grad), ref_grads[name], **GRAD, msg=name)
    ref_norm = torch.nn.utils.get_total_norm(list(ref_grads.values())).item()
    norm = clip_grad_norm(list(ep_model.parameters()), None)
    assert abs(norm - ref_norm) < 1e-4 * max(1.0, ref_norm), (norm, ref_norm)


def run_case(case: str) -> None:
    {"hooks": check_hooks, "trainer": check_trainer}[case]()


if __name__ == "__main__":
    run_cases(run_case)
