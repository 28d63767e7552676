"""Worker for test_gemma_tp: two gloo ranks shard tiny Gemma 2 / Gemma 3 models.

`python _gemma_worker.py RANK WORLD PORT OUT CASE...` runs each case in turn:
`tp:FAMILY:SP[:hf]` applies the family's `tp_plan` (from its registry row, via
`models.hooks`) with `parallelize_module`, to the native class or (`hf`) the transformers
class; `trainer_tp:FAMILY:SP` runs the trainer's `parallelize` with
tp_size 2 (the family plan, then FSDP2); `fsdp:FAMILY` applies FSDP2 per decoder layer
then the root. Each rank compares soft-capped logits, loss and every gradient with the
unsharded model built from the same weights (left padding, a sequence longer than the
sliding window) and writes "CASE ok" or "CASE FAILED <traceback>" to OUT.rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gemma_tiny_configs import VOCAB, gemma_config, randomize_norms
from gloo_cases import run_cases
from layouts import layout


def build_pair(family: str, backend: str = "native") -> tuple[torch.nn.Module, torch.nn.Module]:
    from models import AutoModelForCausalLM

    force_hf = backend == "hf"
    torch.manual_seed(0)
    config = gemma_config(family)
    reference = AutoModelForCausalLM.from_config(config, dtype="float32", force_hf=force_hf)
    randomize_norms(reference)
    sharded = AutoModelForCausalLM.from_config(config, dtype="float32", force_hf=force_hf)
    sharded.load_state_dict(reference.state_dict())
    assert sharded.tuneyard_backend == backend
    return reference.eval(), sharded.eval()


def compare(reference: torch.nn.Module, sharded: torch.nn.Module, model: torch.nn.Module) -> None:
    from torch.distributed.tensor import DTensor

    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    labels = ids.clone()
    labels[1, :4] = -100
    ref_out = reference(input_ids=ids, attention_mask=mask, labels=labels)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    logits = out.logits.full_tensor() if isinstance(out.logits, DTensor) else out.logits
    keep = mask.bool()
    torch.testing.assert_close(logits[keep], ref_out.logits[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, ref_out.loss, atol=1e-5, rtol=0)
    ref_out.loss.backward()
    out.loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in sharded.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def check_tp(family: str, sequence_parallel: bool, backend: str = "native") -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    from models.hooks import tp_plan

    reference, sharded = build_pair(family, backend)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(sharded, mesh, tp_plan(sharded, sequence_parallel=sequence_parallel))
    q_proj = sharded.model.layers[0].self_attn.q_proj.weight
    assert isinstance(q_proj, DTensor) and q_proj.to_local().shape[0] == 64 // mesh.size()
    assert sharded.lm_head.weight is sharded.model.embed_tokens.weight  # still tied
    compare(reference, sharded, sharded)


def check_trainer_tp(family: str, sequence_parallel: bool) -> None:
    from trainer.distributed import DistEnv, build_mesh
    from trainer.parallelize import parallelize

    reference, sharded = build_pair(family)
    rank = dist.get_rank()
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    distributed = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": sequence_parallel}
    setup = layout(distributed, 2)
    topology = build_mesh(env, setup)
    model = parallelize(sharded, topology, setup, env.device, None)
    compare(reference, sharded, model)


def check_fsdp(family: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from models.hooks import decoder_layers

    reference, sharded = build_pair(family)
    for layer in decoder_layers(sharded):
        fully_shard(layer)
    fully_shard(sharded)
    compare(reference, sharded, sharded)


def run_case(case: str) -> None:
    kind, family, *rest = case.split(":")
    if kind == "tp":
        check_tp(family, rest[0] == "1", *rest[1:])
    elif kind == "trainer_tp":
        check_trainer_tp(family, rest[0] == "1")
    else:
        check_fsdp(family)


if __name__ == "__main__":
    run_cases(run_case)
