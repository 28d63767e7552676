"""Worker for test_tp_plan: two gloo ranks shard a tiny model with the `models.hooks` data.

`python _tp_worker.py RANK WORLD PORT OUT CASE...` runs each case in turn (one process
start for all): `tp:BACKEND:SP:TIED` applies `tp_plan`; `fsdp:FAMILY` applies FSDP2
(`fully_shard` per `decoder_layers` entry, then the root); `trainer_tp:FAMILY:BACKEND:SP:TIED`
runs the trainer's `parallelize` with tp_size 2 on a family (the family's plan from its
registry row, then FSDP2). Each rank compares logits, loss
and gradients with the unsharded model built from the same seed and writes one line per
case, "CASE ok" or "CASE FAILED <traceback>", to OUT.rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gloo_cases import run_cases
from layouts import layout


def build(backend: str, tied: bool) -> torch.nn.Module:
    from cli.demo_assets import tiny_llama_config
    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny_llama_config(tie_word_embeddings=tied)
    return AutoModelForCausalLM.from_config(config, dtype="float32", force_hf=backend == "hf")


def check(backend: str, sequence_parallel: bool, tied: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    from models.hooks import tp_plan

    reference, sharded = build(backend, tied), build(backend, tied)
    assert sharded.tuneyard_backend == backend
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(sharded, mesh, tp_plan(sharded, sequence_parallel=sequence_parallel))
    torch.manual_seed(1)
    q_proj = sharded.model.layers[0].self_attn.q_proj.weight
    assert isinstance(q_proj, DTensor) and q_proj.to_local().shape[0] == 64 // mesh.size()
    ids = torch.randint(0, 512, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding exercises the mask path
    ref_out = reference(input_ids=ids, attention_mask=mask, labels=ids)
    out = sharded(input_ids=ids, attention_mask=mask, labels=ids)
    logits = out.logits.full_tensor() if isinstance(out.logits, DTensor) else out.logits
    torch.testing.assert_close(logits, ref_out.logits, atol=1e-5, rtol=1e-5)
    ref_out.loss.backward()
    out.loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in sharded.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def check_fsdp(family: str) -> None:
    from tiny_model_configs import make_config
    from torch.distributed.fsdp import fully_shard

    from models import AutoModelForCausalLM
    from models.hooks import decoder_layers

    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(make_config(family))
    sharded = AutoModelForCausalLM.from_config(make_config(family))
    sharded.load_state_dict(reference.state_dict())
    for layer in decoder_layers(sharded):
        fully_shard(layer)
    fully_shard(sharded)
    torch.manual_seed(1)
    ids = torch.randint(1, 512, (2, 16))
    ref_out, out = reference(input_ids=ids, labels=ids), sharded(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.loss, ref_out.loss, atol=1e-5, rtol=0)
    ref_out.loss.backward()
    out.loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in sharded.named_parameters():
        torch.testing.assert_close(
            param.grad.full_tensor(), ref_grads[name], atol=1e-5, rtol=1e-4, msg=name
        )


def family_config(family: str, tied: bool):
    from tiny_model_configs import make_config

    return make_config(family, tie_word_embeddings=tied)


def check_trainer_tp(family: str, backend: str, sequence_parallel: bool, tied: bool) -> None:
    from torch.distributed.tensor import DTensor

    from models import AutoModelForCausalLM
    from trainer.distributed import DistEnv, build_mesh
    from trainer.parallelize import parallelize

    torch.manual_seed(0)
    config, force_hf = family_config(family, tied), backend == "hf"
    reference = AutoModelForCausalLM.from_config(config, force_hf=force_hf)
    sharded = AutoModelForCausalLM.from_config(config, force_hf=force_hf)
    assert sharded.tuneyard_backend == backend
    sharded.load_state_dict(reference.state_dict())
    rank = dist.get_rank()
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    distributed = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": sequence_parallel}
    setup = layout(distributed, 2)
    topology = build_mesh(env, setup)
    model = parallelize(sharded, topology, setup, env.device, None)
    torch.manual_seed(1)
    ids = torch.randint(1, 512, (2, 16))
    ref_out, out = reference(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
    logits = out.logits.full_tensor() if isinstance(out.logits, DTensor) else out.logits
    torch.testing.assert_close(logits, ref_out.logits, atol=1e-5, rtol=1e-5)
    ref_out.loss.backward()
    out.loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in sharded.named_parameters():
        torch.testing.assert_close(
            param.grad.full_tensor(), ref_grads[name], atol=1e-5, rtol=1e-4, msg=name
        )


def run_case(case: str) -> None:
    kind, *args = case.split(":")
    if kind == "fsdp":
        check_fsdp(args[0])
    elif kind == "trainer_tp":
        check_trainer_tp(args[0], args[1], args[2] == "1", args[3] == "1")
    else:
        check(args[0], args[1] == "1", args[2] == "1")


if __name__ == "__main__":
    run_cases(run_case)
