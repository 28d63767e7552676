"""DeepSeek-V3 trains: loss falls with every parameter getting a gradient, and LoRA (the
trainer's `apply_peft`, all linear layers) keeps the router's correction bias frozen, and
its adapter saves, reloads and resumes exactly with the bias preserved.

With transformers 5, peft maps "all-linear" on a `deepseek_v3` model onto its MoE layout:
the attention linears, plus LoRA on the router weight (`gate.weight`) and on the routed
experts' `down_proj`; the dense and shared-expert MLP linears get none. The test pins
that, so a peft change in what it adapts shows here.
"""

from __future__ import annotations

import copy

import torch
import transformers
from _deepseek_v3_worker import VOCAB, seed_routers, tiny_config

from jobs.recipe.typed import Peft
from models import AutoModelForCausalLM
from models.common.safetensors_io import read_tensors
from models.deepseek_v3.layers import GroupLimitedRouter
from models.hooks import decoder_layers
from trainer.builders import apply_peft
from trainer.checkpoint import consolidate

BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"
LORA = Peft(target_modules=None, exclude_modules=None, match_all_linear=True, dim=4,
            alpha=8.0, dropout=0.0, dropout_position="post", use_dora=False,
            use_triton=False)  # fmt: skip


def _steps(model, optimizer, ids, count: int) -> list[float]:
    losses = []
    for _ in range(count):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_loss_falls_and_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config()).train()
    ids = torch.randint(1, VOCAB, (4, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    assert not bias.requires_grad and bias.grad is None  # a buffer: never trained
    model.zero_grad()
    losses = _steps(model, torch.optim.AdamW(model.parameters(), lr=3e-3), ids, 8)
    assert losses[-1] < losses[0] - 0.5, losses
    assert len(decoder_layers(model)) == 2


def _base_dir(tmp_path):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(tiny_config())
    seed_routers(hf)
    hf.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def _lora_model(base):
    """AutoModel's `target_modules: ['*']`: every linear layer and the routed experts'
    own adapters (`models.common.moe.lora`); the router is not a linear layer."""
    import dataclasses

    star = dataclasses.replace(LORA, match_all_linear=False, target_modules=["*"])
    model = apply_peft(AutoModelForCausalLM.from_pretrained(base), star).train()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    adapted = {n.split(".lora_")[0].split("model.layers.1.")[-1] for n in trainable}
    assert adapted >= {"mlp.experts", "self_attn.kv_b_proj", "mlp.shared_experts.gate_proj"}
    assert "mlp.gate" not in adapted, adapted
    return model


def _router(model) -> GroupLimitedRouter:
    return next(m for m in model.modules() if isinstance(m, GroupLimitedRouter))


def test_lora_keeps_the_correction_bias_and_round_trips_save_reload_resume(tmp_path):
    base = _base_dir(tmp_path)
    model = _lora_model(base)
    bias = _router(model).e_score_correction_bias.clone()
    experts = model.get_base_model().model.layers[1].mlp.experts
    frozen = experts.gate_proj.detach().clone()
    assert bias.abs().sum() > 0
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    ids = torch.randint(1, VOCAB, (2, 16))
    losses = _steps(model, optimizer, ids, 4)
    assert losses[-1] < losses[0], losses
    assert torch.equal(_router(model).e_score_correction_bias, bias)
    assert torch.equal(experts.gate_proj, frozen)
    consolidate.save_lora_adapter(model, tmp_path / "adapter", True, base_model=str(base))
    consolidate.save_lora_base_model(model, tmp_path / "saved_base", True)
    saved = dict(read_tensors(tmp_path / "saved_base" / "model.safetensors"))
    assert torch.equal(saved[BIAS], bias) and saved[BIAS].dtype is torch.float32
    assert sorted(saved) == sorted(dict(read_tensors(base / "model.safetensors")))
    adapter = dict(read_tensors(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)

    resumed = _lora_model(tmp_path / "saved_base")
    consolidate.load_lora_adapter(resumed, tmp_path / "adapter")
    model.eval(), resumed.eval()
    with torch.no_grad():
        assert torch.equal(resumed(input_ids=ids).logits, model(input_ids=ids).logits)
    model.train(), resumed.train()
    resumed_opt = torch.optim.AdamW([p for p in resumed.parameters() if p.requires_grad], lr=1e-2)
    resumed_opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as if from disk
    assert _steps(resumed, resumed_opt, ids, 2) == _steps(model, optimizer, ids, 2)
    assert torch.equal(_router(resumed).e_score_correction_bias, bias)


def test_explicit_lora_targets_leave_router_and_experts_fully_frozen():
    import dataclasses

    torch.manual_seed(0)
    targets = dataclasses.replace(
        LORA, match_all_linear=False, target_modules=["q_a_proj", "kv_b_proj", "o_proj"]
    )
    model = apply_peft(AutoModelForCausalLM.from_config(tiny_config()), targets)
    adapted = {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert adapted and all(n.rsplit(".", 1)[-1] in ("q_a_proj", "kv_b_proj", "o_proj")
                           for n in adapted)  # fmt: skip
    moe = model.get_base_model().model.layers[1].mlp
    assert type(moe.gate) is GroupLimitedRouter  # not wrapped by peft
    assert not any(p.requires_grad for p in moe.parameters())
