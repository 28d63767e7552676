"""A model family added the way a plugin adds one: its own class, plan and adapter reference,
registered for one test at a time. `tests/` is on `sys.path`, so any test folder imports it.

The plan shards only the first decoder layer on its own (so a test sees the row's plan, not
the common one, was used) and refuses tensor parallelism with its own reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from models import registry
from models.common.parallelize import ParallelPlan
from models.llama.model import LlamaForCausalLM

ARCHITECTURE = "PluginLlamaForCausalLM"
ADAPTER = "models.common.moe.state_dict_adapter:GroupedExpertsStateDictAdapter"


class PluginLlama(LlamaForCausalLM):
    architecture = ARCHITECTURE


class FirstLayerOnlyPlan(ParallelPlan):
    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return super().fsdp_units(model)[:1]

    def tp_unsupported_reason(self, model: nn.Module, tp_size: int | None = None) -> str:
        return "the plugin plan has no tensor-parallel layout"


PLUGIN_PLAN = FirstLayerOnlyPlan()


@contextmanager
def registered_plugin() -> Iterator[registry.ArchEntry]:
    entry = registry.ArchEntry(
        ARCHITECTURE, __name__, "PluginLlama", registry.ModelCapabilities(supports_tp=True),
        registry.TieSupport.BOTH, "plugin", parallel_plan=f"{__name__}:PLUGIN_PLAN",
        state_dict_adapter=ADAPTER,
    )  # fmt: skip
    registry.register(entry)
    try:
        yield entry
    finally:
        registry._REGISTRY.pop(entry.architecture)
