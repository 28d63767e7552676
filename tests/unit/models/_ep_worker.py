"""Worker for test_expert_parallel: two gloo ranks spread a tiny Qwen3-MoE's experts.

`python _ep_worker.py RANK WORLD PORT OUT CASE...` runs each case and writes one line per
case, "CASE ok" or "CASE FAILED <traceback>", to OUT.rank. The ranks hold different
batches (different token counts); the reference is the unsharded model on both batches.
Other MoE families' workers pass their own `build` (a tiny model pair, vocabulary 512).
`hooks`: `models.hooks.apply_expert_parallel` alone; every rank's loss is its summed
cross entropy over the global label count, so the summed losses equal the reference loss
and the summed non-expert gradients (and the expert gradients as they are) equal the
reference gradients. `trainer`: `trainer.parallelize.parallelize` with ep_size 2 (experts
plus FSDP2 on the rest) and the trainer's loss (x dp_size); every gradient, gathered,
and the clipped gradient norm must equal the reference's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_cases import run_cases
from layouts import layout
from torch.distributed.tensor import DTensor


def build_pair():
    from tiny_model_configs import make_config

    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    config = make_config("qwen3_moe", mlp_only_layers=[], num_experts=4)
    reference = AutoModelForCausalLM.from_config(config)
    ep_model = AutoModelForCausalLM.from_config(config)
    ep_model.load_state_dict(reference.state_dict())
    return reference, ep_model


def batches() -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randint(1, 512, (2, 16)), torch.randint(1, 512, (3, 10))]


def ce_sum(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
    )


def reference_grads(reference, data, scale: float):
    total = sum(ids[:, 1:].numel() for ids in data)
    logits = [reference(input_ids=ids).logits for ids in data]
    loss = sum(ce_sum(lg, ids) for lg, ids in zip(logits, data, strict=True)) / total
    (loss * scale).backward()
    grads = {n: p.grad for n, p in reference.named_parameters()}
    return logits, loss, grads, total


def _full(tensor):
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def check_hooks(build=build_pair, expert_tensors: int = 6, local_experts: int = 2) -> None:
    """`expert_tensors`: how many `[E, ...]` tensors the model's layers hold in all;
    `local_experts`: how many experts each of the two ranks keeps."""
    from torch.distributed.device_mesh import init_device_mesh

    from models.hooks import apply_expert_parallel

    reference, ep_model = build()
    rank, data = dist.get_rank(), batches()
    ref_logits, ref_loss, ref_grads, total = reference_grads(reference, data, 1.0)
    params = apply_expert_parallel(ep_model, init_device_mesh("cpu", (2,)))
    assert len(params) == expert_tensors
    assert all(p.to_local().shape[0] == local_experts for p in params)
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
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def check_trainer(build=build_pair) -> None:
    from trainer.distributed import DistEnv, build_mesh
    from trainer.parallelize import clip_grad_norm, parallelize

    reference, ep_model = build()
    rank, data = dist.get_rank(), batches()
    ref_logits, _, ref_grads, total = reference_grads(reference, data, 1.0)
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    distributed = {"strategy": "fsdp2", "ep_size": 2}
    setup = layout(distributed, 2)
    topology = build_mesh(env, setup)
    assert topology.ep_size == 2 and topology.dp_size == 2
    model = parallelize(ep_model, topology, setup, env.device, None)
    logits = model(input_ids=data[rank]).logits
    torch.testing.assert_close(logits, ref_logits[rank], atol=1e-5, rtol=1e-5)
    (ce_sum(logits, data[rank]) * topology.dp_size / total).backward()
    for name, param in ep_model.named_parameters():
        grad = _full(param.grad)
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    ref_norm = torch.nn.utils.get_total_norm(list(ref_grads.values())).item()
    norm = clip_grad_norm(list(ep_model.parameters()), None)
    assert abs(norm - ref_norm) < 1e-4 * max(1.0, ref_norm), (norm, ref_norm)


def run_case(case: str) -> None:
    {"hooks": check_hooks, "trainer": check_trainer}[case]()


if __name__ == "__main__":
    run_cases(run_case)
