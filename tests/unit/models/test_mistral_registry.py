"""The Mistral and Mixtral registry rows agree with their classes and claim only what is proven.

Mistral: TP and SP (proven in test_mistral_distributed.py), LoRA, both tie modes, the
common dense plan, no adapter. Mixtral: EP and LoRA, no TP/SP, its own plan and adapter.
Neither claims PP or CP. `from_pretrained` on a saved tiny checkpoint picks the native class.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import assert_registry_row_agrees
from mistral_family_configs import make_family_config

from models import AutoModelForCausalLM, registry
from models.registry import DENSE_PARALLEL_PLAN, TieSupport

ARCHITECTURES = {"mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM"}


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_row_agrees_with_the_class(family):
    model_type = make_family_config(family).model_type
    entry, cls = assert_registry_row_agrees(ARCHITECTURES[family], family, model_type)
    assert entry.tie_support is TieSupport.BOTH
    caps = entry.capabilities
    assert caps.supports_lora and caps.supports_fsdp
    assert not (caps.supports_pp or caps.supports_cp)
    if family == "mistral":
        assert caps.supports_tp and caps.supports_sequence_parallel and not caps.supports_ep
        assert entry.parallel_plan == DENSE_PARALLEL_PLAN and entry.state_dict_adapter is None
    else:
        assert caps.supports_ep and not (caps.supports_tp or caps.supports_sequence_parallel)
        assert registry.load_state_dict_adapter(entry) is cls.state_dict_adapter()
        assert cls._keep_in_fp32_modules_strict == ["mlp.gate"]


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_from_pretrained_picks_the_native_class(family, tmp_path):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(make_family_config(family)).eval()
    hf.save_pretrained(tmp_path)
    native = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(native).__name__ == ARCHITECTURES[family]
    assert native.tuneyard_backend == "native"
    ids = torch.randint(1, 128, (2, 20))
    torch.testing.assert_close(native(input_ids=ids).logits, hf(input_ids=ids).logits,
                               atol=1e-5, rtol=0)  # fmt: skip
