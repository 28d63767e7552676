"""`unwrap_model` finds the causal LM under compile, DDP, FSDP1/FSDP2 and PEFT, by type."""

from __future__ import annotations

import pytest
import torch
from tiny_model_configs import make_config
from torch import nn

from models import AutoModelForCausalLM
from models.common.wrappers import unwrap_model
from models.llama.model import LlamaForCausalLM


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-process gloo group: DDP and FSDP need one, even on a single rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config("llama"))


def lora(model: nn.Module) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))


def test_a_plain_model_is_its_own_model(model):
    assert unwrap_model(model) is model


def test_compile_and_peft_are_peeled(model):
    assert unwrap_model(torch.compile(model)) is model
    assert unwrap_model(lora(model)) is model


def test_ddp_and_nested_wrappers_are_peeled(model, one_rank_group):
    from torch.nn.parallel import DistributedDataParallel

    assert unwrap_model(DistributedDataParallel(model)) is model
    nested = torch.compile(DistributedDataParallel(lora(model)))
    assert unwrap_model(nested) is model


def test_fsdp2_keeps_the_model_and_its_family_type(model, one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model, mesh=mesh)
    assert unwrap_model(model) is model and isinstance(model, LlamaForCausalLM)


def test_fsdp2_over_peft_is_peeled(model, one_rank_group):
    """FSDP2 renames the PEFT class (FSDPPeftModel); only a type check still sees PEFT."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    wrapped = lora(model)
    fully_shard(wrapped, mesh=init_device_mesh("cpu", (1,)))
    assert type(wrapped).__name__ != "PeftModel"
    assert unwrap_model(wrapped) is model


def test_fsdp1_is_peeled(model, one_rank_group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    assert unwrap_model(FullyShardedDataParallel(model, device_id=torch.device("cpu"))) is model


def test_look_alikes_by_name_or_attribute_are_not_unwrapped(model):
    class PeftModel(nn.Module):  # a wrapper's name, not its type
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.base_model = inner
            self.module = inner
            self._orig_mod = inner

    impostor = PeftModel(model)
    assert unwrap_model(impostor) is impostor
