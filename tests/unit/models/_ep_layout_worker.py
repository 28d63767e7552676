"""Worker for test_expert_parallel_layouts: the trainer's `parallelize` with `ep_size: 2` on
2 or 4 gloo ranks, in fp32 or bf16, against one process holding the whole model.

`python _ep_layout_worker.py RANK WORLD PORT OUT CASE...`; a case is `family:dtype`
(`qwen3_moe`, `mixtral`, `deepseek_v3` or `gpt_oss`; `float32` or `bfloat16`). Every rank
feeds its own batch (different token counts); the reference is the unsharded model on all
of them, with the trainer's loss (summed cross entropy x dp_size / global label count on
each rank). On 4 ranks each pair of adjacent ranks spreads the experts (ep 2) and ranks r
and r + 2 hold the same ones (expert data parallelism, FSDP2 over them). Checked: logits,
every gathered gradient (in the reference's dtype: fp32 for what a family keeps fp32), the
clipped gradient norm, and that every expert DTensor gathers back to the whole experts.

fp32 agrees to 1e-5 (only the reduction order differs). bf16 cannot agree bit for bit:
each bf16 sum rounds to 8 significant bits, and the ranks sum partial gradients in another
order than one process does. So each bf16 gradient is held to what bf16 itself allows: its
distance from the exact-math gradient (the same bf16 weights, computed in fp32) must be
within 2x that of the one-process bf16 gradient plus 2^-8 (bf16's unit roundoff) of the
gradient's size: expert parallelism adds no error beyond a second rounding of the same
size. The logits, and the norm, are held to 2^-7 relative (two bf16 roundings).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_cases import run_cases
from layouts import layout
from torch.distributed.tensor import DTensor

BF16_EPS = 2.0**-8  # bf16 unit roundoff: 8 significant bits
WRAPPER = "_checkpoint_wrapped_module."


def _config_and_state(family: str):
    """A tiny config of a MoE family (vocabulary 512) and seeded fp32 weights for it."""
    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    if family == "gpt_oss":  # biases and sinks drawn large enough to matter
        from gpt_oss_tiny import seeded_hf_model, tiny_config

        hf = seeded_hf_model(tiny_config(vocab_size=512))
        adapter = AutoModelForCausalLM.from_config(hf.config).state_dict_adapter()
        return hf.config, adapter.from_hf(hf.state_dict(), hf.config)
    if family == "deepseek_v3":  # 2 MoE layers of 8 experts, routers seeded to steer
        from _deepseek_v3_worker import seed_routers, tiny_config

        config = tiny_config(num_hidden_layers=3, vocab_size=512)
        model = AutoModelForCausalLM.from_config(config)
        seed_routers(model)
        return config, model.state_dict()
    if family == "mixtral":
        from mistral_family_configs import mixtral_config

        config = mixtral_config(vocab_size=512)
    else:
        from tiny_model_configs import make_config

        config = make_config("qwen3_moe", mlp_only_layers=[], num_experts=4)
    return config, AutoModelForCausalLM.from_config(config).state_dict()


def build_models(family: str, dtype: torch.dtype):
    """(the model to shard, the one-process reference, both in `dtype` with the family's
    fp32 parameters kept, and the same weights in fp32: exact math for them)."""
    from models import AutoModelForCausalLM

    config, state = _config_and_state(family)
    sharded, reference = (AutoModelForCausalLM.from_config(config, dtype=dtype) for _ in "ab")
    sharded.load_state_dict(state)
    reference.load_state_dict(state)
    exact = AutoModelForCausalLM.from_config(config)
    exact.load_state_dict({k: v.float() for k, v in reference.state_dict().items()})
    return sharded, reference, exact


def batches(world: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randint(1, 512, (2, 8 + 3 * rank)) for rank in range(world)]


def ce_sum(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        ids[:, 1:].reshape(-1),
        reduction="sum",
    )


def reference_grads(model, data: list[torch.Tensor]):
    total = sum(ids[:, 1:].numel() for ids in data)
    logits = [model(input_ids=ids).logits for ids in data]
    loss = sum(ce_sum(lg, ids) for lg, ids in zip(logits, data, strict=True)) / total
    loss.backward()
    return logits, {n: p.grad for n, p in model.named_parameters()}, total


def named_parameters(model) -> list[tuple[str, torch.Tensor]]:
    """The parameters by their unwrapped names (no activation-checkpoint wrapper part)."""
    return [(n.replace(WRAPPER, ""), p) for n, p in model.named_parameters()]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def parallelize_ep2(model, world: int):
    from trainer.distributed import DistEnv, build_mesh
    from trainer.parallelize import parallelize

    rank = dist.get_rank()
    env = DistEnv(rank, world, rank, world, torch.device("cpu"))
    setup = layout({"strategy": "fsdp2", "ep_size": 2, "activation_checkpointing": True}, world)
    topology = build_mesh(env, setup)
    assert topology.ep_size == 2 and topology.dp_size == world
    return parallelize(model, topology, setup, env.device, None), topology


def check_experts_placed(model, reference, world: int) -> None:
    """Experts are DTensors on ep (and, on 4 ranks, also on the expert-dp ranks): a rank
    keeps 1/world of them, and they gather back to the whole experts."""
    weights = dict(reference.named_parameters())
    experts = [(n, p) for n, p in named_parameters(model) if ".experts." in n]
    assert experts
    for name, param in experts:
        assert isinstance(param, DTensor), name
        assert param.to_local().numel() * world == param.numel(), name
        assert torch.equal(param.full_tensor(), weights[name].detach()), name


def assert_bf16_grad_close(name: str, got, one_process, exact) -> None:
    allowed = 2 * (one_process.float() - exact).norm() + BF16_EPS * exact.norm()
    error = (got.float() - exact).norm()
    assert error <= allowed, (name, float(error), float(allowed))


def check(case: str) -> None:
    """`case` is `family:dtype`, e.g. `qwen3_moe:bfloat16`."""
    from trainer.parallelize import clip_grad_norm

    family, dtype_name = case.split(":")
    dtype = getattr(torch, dtype_name)
    rank, world = dist.get_rank(), dist.get_world_size()
    model, reference, exact = build_models(family, dtype)
    kept = {p.dtype for p in model.parameters()} - {dtype}
    assert kept == (set() if dtype == torch.float32 else {torch.float32}), kept
    data = batches(world)
    ref_logits, ref_grads, total = reference_grads(reference, data)
    _, exact_grads, _ = reference_grads(exact, data)
    sharded, topology = parallelize_ep2(model, world)
    check_experts_placed(model, reference, world)
    logits = sharded(input_ids=data[rank]).logits
    tol = 1e-5 if dtype == torch.float32 else 2 * BF16_EPS
    torch.testing.assert_close(logits.float(), ref_logits[rank].float(), atol=tol, rtol=tol)
    (ce_sum(logits, data[rank]) * topology.dp_size / total).backward()
    ref_params = dict(reference.named_parameters())
    for name, param in named_parameters(model):
        grad = _full(param.grad)
        assert grad.dtype == ref_params[name].dtype, name
        if dtype == torch.float32:
            torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
        else:
            assert_bf16_grad_close(name, grad, ref_grads[name], exact_grads[name])
    ref_norm = torch.nn.utils.get_total_norm([g.float() for g in ref_grads.values()]).item()
    norm = clip_grad_norm(list(model.parameters()), None)
    assert abs(norm - ref_norm) <= tol * ref_norm, (norm, ref_norm)


if __name__ == "__main__":
    run_cases(check)
