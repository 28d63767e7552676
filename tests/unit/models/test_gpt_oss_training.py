"""gpt-oss training: AdamW steps lower the loss, LoRA trains adapters only, registry row.

A few AdamW steps on a fixed batch lower the loss, with a gradient for every parameter
(sinks, router bias, expert biases included) and the load-balancing loss switched on.
LoRA through the trainer's `apply_peft` ("all-linear": the attention projections; the
grouped experts and the router are parameters, not linears) trains only the adapters,
leaves the base weights untouched, and the saved adapter applied to transformers'
`GptOssForCausalLM` gives the same logits. The registry row agrees with the class.
"""

from __future__ import annotations

import torch
import transformers
from gpt_oss_tiny import VOCAB, seeded_hf_model, tiny_config

from models import AutoModelForCausalLM, registry
from models.gpt_oss import GptOssForCausalLM
from models.hooks import decoder_layers
from models.registry import TieSupport


def _train(model: torch.nn.Module, steps: int = 8, lr: float = 3e-3) -> list[float]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (4, 24))
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if not losses:
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            assert not missing, missing
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_loss_falls_and_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(output_router_logits=True)).train()
    assert isinstance(model, GptOssForCausalLM)
    losses = _train(model)
    assert losses[-1] < losses[0] - 0.5, losses
    assert len(decoder_layers(model)) == 2


def test_lora_trains_adapters_only_and_the_adapter_applies_to_transformers(tmp_path):
    from peft import PeftModel

    from jobs.recipe.typed import Peft
    from trainer.builders import apply_peft

    seeded_hf_model().save_pretrained(tmp_path / "base")
    native = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype="float32")
    base = {n: p.detach().clone() for n, p in native.named_parameters()}
    peft = Peft(None, None, True, 8, 16.0, 0.0, "post", False, False)
    model = apply_peft(native, peft).train()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    losses = _train(model, lr=5e-2)
    assert losses[-1] < losses[0] - 0.1, losses
    for name, param in native.named_parameters():
        if "lora_" not in name and "base_layer" not in name and name in base:
            assert torch.equal(param, base[name]), name
    model.save_pretrained(tmp_path / "adapter")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reference = PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    ids = torch.randint(1, VOCAB, (2, 20))
    torch.testing.assert_close(
        model.eval()(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=0
    )


def test_registry_row_agrees_with_the_class():
    entry = registry.get_entry("GptOssForCausalLM")
    assert registry.load_class(entry) is GptOssForCausalLM
    assert registry.entry_for_model_type("gpt_oss") is entry
    assert (
        entry.tie_support is TieSupport.UNTIED_ONLY is GptOssForCausalLM.tie_word_embeddings_support
    )
    assert entry.capabilities == GptOssForCausalLM.capabilities
    assert registry.load_state_dict_adapter(entry) is GptOssForCausalLM.state_dict_adapter
