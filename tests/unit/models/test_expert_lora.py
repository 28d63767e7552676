"""LoRA on grouped experts (`models.common.moe.lora`) and how `apply_peft` chooses them.

The expert adapter computes what `W + s B A` computes per expert; it goes to disk in
peft's per-expert layout and comes back unchanged; `target_modules: ['*']` adapts the
experts (rank dim // experts per token with `moe_rank_scaling`) and the linear layers,
never norms or containers; `match_all_linear` and exclusion forms leave the experts frozen;
a family whose expert adapters cannot be saved is refused with the fix.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from jobs.recipe.typed import Peft
from models import AutoModelForCausalLM
from models.common.moe import lora
from models.common.moe.layers import GroupedExperts
from trainer.builders import apply_peft
from trainer.errors import TrainerError


def _experts() -> GroupedExperts:
    config = transformers.Qwen3MoeConfig(
        hidden_size=16, moe_intermediate_size=8, num_experts=4, hidden_act="silu"
    )
    experts = GroupedExperts(config)
    with torch.no_grad():
        experts.init_weights(0.2)
    return experts


def _tiny_moe() -> nn.Module:
    config = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype="float32")


def _peft(**kw) -> Peft:
    base = dict(target_modules=None, exclude_modules=None, match_all_linear=None, dim=4,
                alpha=8.0, dropout=0.0, dropout_position="post", use_dora=False,
                use_triton=False, moe_rank_scaling=False)  # fmt: skip
    return Peft(**{**base, **kw})


def test_the_adapter_is_the_merged_weight_per_expert() -> None:
    torch.manual_seed(0)
    experts = _experts()
    flat = torch.randn(10, 16)
    weights = torch.rand(10, 2)
    ids = torch.randint(0, 4, (10, 2))
    base = experts(flat, weights, ids)
    lora.add_expert_lora(experts, rank=2, alpha=6.0)
    torch.testing.assert_close(experts(flat, weights, ids), base)  # B starts at zero
    with torch.no_grad():
        experts.lora_gate_up_B.normal_()
        experts.lora_down_B.normal_()
    adapted = experts(flat, weights, ids)
    scale, inter = 3.0, 8
    with torch.no_grad():
        delta_gu = scale * experts.lora_gate_up_B @ experts.lora_gate_up_A
        experts.gate_proj += delta_gu[:, :inter]
        experts.up_proj += delta_gu[:, inter:]
        experts.down_proj += scale * experts.lora_down_B @ experts.lora_down_A
        experts.lora_gate_up_B.zero_()
        experts.lora_down_B.zero_()
    torch.testing.assert_close(adapted, experts(flat, weights, ids), rtol=1e-5, atol=1e-5)


def test_disk_layout_is_per_expert_and_round_trips() -> None:
    experts = _experts()
    lora.add_expert_lora(experts, rank=2, alpha=4.0)
    with torch.no_grad():
        experts.lora_gate_up_B.normal_()
    prefix = "base_model.model.model.layers.0.mlp.experts"
    state = {f"{prefix}.{n}": getattr(experts, n).detach() for n in lora.LORA_TENSORS}
    state["other.lora_A.weight"] = torch.ones(1)
    hf = lora.lora_to_hf(state)
    assert hf[f"{prefix}.3.up_proj.lora_B.weight"].shape == (8, 2)
    assert torch.equal(
        hf[f"{prefix}.1.gate_proj.lora_A.weight"], hf[f"{prefix}.1.up_proj.lora_A.weight"]
    )
    back = lora.lora_from_hf(hf, count=4)
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor), name


def test_disk_layout_refuses_missing_experts_and_split_a_factors() -> None:
    experts = _experts()
    lora.add_expert_lora(experts, rank=2, alpha=4.0)
    prefix = "m.layers.0.mlp.experts"
    hf = lora.lora_to_hf({f"{prefix}.{n}": getattr(experts, n).detach() for n in lora.LORA_TENSORS})
    missing = {k: v for k, v in hf.items() if ".3.down_proj" not in k}
    with pytest.raises(lora.ExpertLoraError, match=r"experts \[3\] are missing"):
        lora.lora_from_hf(missing, count=4)
    split = dict(hf)
    split[f"{prefix}.0.up_proj.lora_A.weight"] = hf[f"{prefix}.0.up_proj.lora_A.weight"] + 1
    with pytest.raises(lora.ExpertLoraError, match="different lora_A"):
        lora.lora_from_hf(split, count=4)


def test_star_adapts_experts_and_linear_layers_only() -> None:
    model = apply_peft(_tiny_moe(), _peft(target_modules=["*"], moe_rank_scaling=True))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    experts = model.base_model.model.model.layers[0].mlp.experts
    assert experts.lora_gate_up_A.shape == (4, 2, 32)  # rank 4 // 2 experts per token
    assert experts.lora_gate_up_A.requires_grad and not experts.gate_proj.requires_grad
    assert any(".self_attn.q_proj.lora_A" in n for n in trainable)
    assert any("lm_head.lora_A" in n for n in trainable)  # a linear layer, as in AutoModel
    assert not any("norm" in n for n in trainable)


@pytest.mark.parametrize(
    "peft", [_peft(match_all_linear=True), _peft(exclude_modules=["*.o_proj"])]
)
def test_linear_forms_leave_the_experts_frozen(peft: Peft) -> None:
    model = apply_peft(_tiny_moe(), peft)
    # peft's transformers-v5 MoE renaming (by model_type) would adapt the experts' down_proj
    # and the router as parameters; the native class keeps v4 modules, so it stays off
    names = [n for n, _ in model.named_parameters()]
    assert not any("experts.lora" in n or "mlp.gate.lora" in n for n in names)
    assert any("q_proj.lora_A" in n for n in names)
    assert model.config.model_type == "qwen3_moe"  # hidden only while peft injected


def test_dora_on_experts_and_an_unsaveable_family_are_refused() -> None:
    with pytest.raises(TrainerError, match="DoRA on routed experts"):
        apply_peft(_tiny_moe(), _peft(target_modules=["*.mlp.experts", "*_proj"], use_dora=True))
    config = transformers.MixtralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
    )  # fmt: skip
    mixtral = AutoModelForCausalLM.from_config(config, dtype="float32")
    with pytest.raises(TrainerError, match=r"target linear layers by name"):
        apply_peft(mixtral, _peft(target_modules=["*"]))


def test_a_glob_with_no_linear_layer_is_a_data_error() -> None:
    with pytest.raises(TrainerError, match="matches no linear layer"):
        apply_peft(_tiny_moe(), _peft(target_modules=["*.mlp.experts"]))


def test_experts_of_a_hugging_face_class_are_refused_not_left_frozen() -> None:
    """Only the registry rows with `supports_expert_lora` adapt experts, and only their
    native grouped experts: transformers' own Qwen3-MoE class has experts it cannot save."""
    config = _tiny_moe().config
    hf = transformers.Qwen3MoeForCausalLM(config)
    with pytest.raises(TrainerError, match=r"selects the routed experts \(Qwen3MoeExperts\)"):
        apply_peft(hf, _peft(target_modules=["*"]))


def test_a_scaled_rank_below_one_is_a_data_error() -> None:
    with pytest.raises(TrainerError, match="experts per token is 0"):
        apply_peft(_tiny_moe(), _peft(target_modules=["*"], dim=1, moe_rank_scaling=True))
