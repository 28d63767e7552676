"""Tiny DeepSeek-V3 configs for the deepseek_v3 tests, and their two-rank gloo worker.

`tiny_config(**overrides)`: a ~100k-parameter DeepSeek-V3 (q LoRA rank, interleaved RoPE,
layer 0 dense, layer 1 MoE with 8 routed experts in 4 groups, 1 shared expert) in fp32.
`seeded_pair(config)`: the Hugging Face model with router weights and correction biases
large enough that both decide which experts are chosen, and the native model with the
same weights.

As a worker, `python _deepseek_v3_worker.py RANK WORLD PORT OUT CASE...` (see gloo_cases)
runs: `ep_hooks` (`models.hooks.apply_expert_parallel` alone), `ep_trainer`
(`trainer.parallelize.parallelize` with ep_size 2: experts spread, FSDP2 on the rest) and
`tp:SP:Q_LORA` (the trainer's parallelize with tp_size 2, sequence parallel or not, with or
without a q LoRA rank). Each compares logits, loss and every gradient with the unsharded
model on the same data; the EP ranks hold batches of different token counts.
"""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 128
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=32,
            q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=4,
            topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
            max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=False)  # fmt: skip
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
        "mscale_all_dim": 0.707, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1}  # fmt: skip


def tiny_config(**overrides: Any):
    import transformers

    return transformers.DeepseekV3Config(**{**TINY, **overrides})


@torch.no_grad()
def seed_routers(model: torch.nn.Module, seed: int = 0) -> None:
    """Router weights ~N(0, 0.5) and biases in +-0.1: scores and bias both matter."""
    generator = torch.Generator().manual_seed(seed)
    for name, module in model.named_modules():
        if name.endswith("mlp.gate"):
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.5)
            bias = module.e_score_correction_bias
            bias.copy_((torch.rand(bias.shape, generator=generator) - 0.5) * 0.2)


def seeded_pair(config: Any):
    """(Hugging Face model, native model) in eval mode with identical weights."""
    import transformers
    from tiny_model_configs import hf_to_native_state

    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    seed_routers(hf)
    native = AutoModelForCausalLM.from_config(config).eval()
    assert native.tuneyard_backend == "native"
    native.load_state_dict(hf_to_native_state(hf.state_dict()), strict=True)
    return hf, native


def _native_pair(config: Any):
    from models import AutoModelForCausalLM

    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config)
    seed_routers(reference)
    sharded = AutoModelForCausalLM.from_config(config)
    sharded.load_state_dict(reference.state_dict())
    return reference, sharded


def _ep_pair():
    """The pair `_ep_worker`'s checks shard: 3 layers (2 MoE, 8 experts each); its batches
    draw ids below 512."""
    return _native_pair(tiny_config(num_hidden_layers=3, vocab_size=512))


def _trainer_model(model, distributed: dict[str, Any]):
    import torch.distributed as dist
    from layouts import layout

    from trainer.distributed import DistEnv, build_mesh
    from trainer.parallelize import parallelize

    rank = dist.get_rank()
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    setup = layout(distributed, 2)
    topology = build_mesh(env, setup)
    return parallelize(model, topology, setup, env.device, None), topology


def check_tp(sequence_parallel: bool, q_lora: bool) -> None:
    from _ep_worker import _full
    from torch.distributed.tensor import DTensor

    config = tiny_config(q_lora_rank=48 if q_lora else None)
    reference, sharded = _native_pair(config)
    distributed = {"strategy": "fsdp2", "tp_size": 2, "sequence_parallel": sequence_parallel}
    model, _ = _trainer_model(sharded, distributed)
    attn = sharded.model.layers[0].self_attn
    kv_b = attn.kv_b_proj.weight
    assert isinstance(kv_b, DTensor) and kv_b.to_local().shape[0] <= 4 * 32 // 2
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding exercises the masked path
    ref_out = reference(input_ids=ids, attention_mask=mask, labels=ids)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    torch.testing.assert_close(_full(out.logits), ref_out.logits, atol=1e-5, rtol=1e-5)
    ref_out.loss.backward()
    out.loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, param in sharded.named_parameters():
        torch.testing.assert_close(
            _full(param.grad), ref_grads[name], atol=1e-5, rtol=1e-4, msg=name
        )


def run_case(case: str) -> None:
    kind, *args = case.split(":")
    if kind == "tp":
        check_tp(args[0] == "1", args[1] == "1")
    else:
        from _ep_worker import check_hooks, check_trainer

        checks = {
            "ep_hooks": lambda: check_hooks(_ep_pair, expert_tensors=6, local_experts=4),
            "ep_trainer": lambda: check_trainer(_ep_pair),
        }
        checks[kind]()


if __name__ == "__main__":
    from gloo_cases import run_cases

    run_cases(run_case)
