"""A LoRA adapter saved while the decoder layers are activation-checkpointed holds every
adapter tensor (trainer.checkpoint.consolidate.peft_adapter_state).

peft 0.21 selects the adapter's tensors by the module-tree names of its LoRA layers, and
torch's checkpoint wrapper puts `_checkpoint_wrapped_module.` into those names while the
state dict leaves it out: without the mapping, the saved adapter had none of the wrapped
layers' tensors (a dense model's: 0 of 28), and a resume restarted them from their init.
"""

from __future__ import annotations

import torch
import transformers
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from jobs.recipe.typed import Peft
from models import AutoModelForCausalLM
from trainer.builders import apply_peft
from trainer.checkpoint import consolidate

LORA = Peft(target_modules=None, exclude_modules=None, match_all_linear=True, dim=4, alpha=8.0,
            dropout=0.0, dropout_position="post", use_dora=False, use_triton=False)  # fmt: skip


def _checkpointed_lora_model() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = apply_peft(AutoModelForCausalLM.from_config(config, dtype="float32"), LORA)
    layers = model.get_base_model().model.layers
    for index in range(len(layers)):
        layers[index] = checkpoint_wrapper(layers[index])
    return model


def test_every_adapter_tensor_is_saved_under_its_plain_name() -> None:
    model = _checkpointed_lora_model()
    gathered = consolidate.gather_adapter_tensors(model, keep=True)
    state = consolidate.peft_adapter_state(model, gathered)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(state) == len(trained) == 28
    assert "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight" in state
    assert not any("_checkpoint_wrapped_module" in name for name in state)


def test_the_saved_adapter_restores_an_unwrapped_model(tmp_path) -> None:
    model = _checkpointed_lora_model()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    consolidate.save_lora_adapter(model, tmp_path / "adapter", True)
    torch.manual_seed(1)  # other initial adapters: only the restore can make them equal
    config = model.get_base_model().config
    fresh = apply_peft(AutoModelForCausalLM.from_config(config, dtype="float32"), LORA)
    base = {k: v for k, v in model.get_base_model().state_dict().items() if "lora_" not in k}
    fresh.get_base_model().load_state_dict(base, strict=False)  # the same base weights
    consolidate.load_lora_adapter(fresh, tmp_path / "adapter")
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=ids).logits, model(input_ids=ids).logits)
