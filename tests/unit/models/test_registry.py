"""The registry table agrees with the classes it names, reports import failures, stays torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest
from family_checks import assert_class_declares_no_capabilities
from tiny_model_configs import make_config

from models import registry
from models.registry import ArchEntry, ModelCapabilities, TieSupport

FAMILY_CONFIG = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}  # fmt: skip


def test_every_row_imports():
    assert registry.import_failures() == {}
    assert {e.architecture for e in registry.registered_architectures()} >= set(FAMILY_CONFIG)


@pytest.mark.parametrize("architecture", sorted(FAMILY_CONFIG))
def test_class_agrees_with_its_row(architecture):
    """The row is the one capability table: the class names its architecture and reads its
    tie support and adapter from the row, restating none of them."""
    entry = registry.get_entry(architecture)
    cls = registry.load_class(entry)
    assert cls.architecture == architecture
    assert_class_declares_no_capabilities(cls)
    assert cls.tie_support() is entry.tie_support
    assert cls.state_dict_adapter() is registry.load_state_dict_adapter(entry)
    config = make_config(FAMILY_CONFIG[architecture])
    assert entry.family in cls.__module__ and entry.config_model_types == (config.model_type,)


def test_the_class_check_finds_a_restated_capability():
    from models.llama.model import LlamaForCausalLM

    class Restating(LlamaForCausalLM):
        capabilities = registry.ModelCapabilities(supports_tp=True)

    Restating.__module__ = "models.restating"
    with pytest.raises(AssertionError, match="restates"):
        assert_class_declares_no_capabilities(Restating)


@pytest.mark.parametrize("entry", registry.registered_architectures(), ids=lambda e: e.family)
def test_every_row_references_a_plan_and_adapter_that_resolve(entry):
    from models.common.parallelize import ParallelPlan

    assert isinstance(registry.load_parallel_plan(entry), ParallelPlan)
    adapter = registry.load_state_dict_adapter(entry)
    assert adapter is None or isinstance(adapter, type)


def test_bad_references_are_reported():
    with pytest.raises(ValueError, match="not a 'package.module:attribute'"):
        registry.resolve_reference("models.common.parallelize.DENSE_PLAN")
    entry = ArchEntry(
        "BadPlanForCausalLM", "models.llama.model", "LlamaForCausalLM", ModelCapabilities(),
        TieSupport.BOTH, "bad", parallel_plan="models.common.parallelize:NO_SUCH_PLAN",
    )  # fmt: skip
    registry.register(entry)
    try:
        assert "AttributeError" in registry.import_failures()["BadPlanForCausalLM"]
    finally:
        registry._REGISTRY.pop("BadPlanForCausalLM")


def test_unknown_architecture_gets_data_parallel_only():
    caps = registry.capabilities_for("GPT2LMHeadModel")
    assert caps == registry.HF_FALLBACK_CAPABILITIES and not caps.supports_tp
    assert registry.capabilities_for(None) == registry.HF_FALLBACK_CAPABILITIES


def test_broken_plugin_row_is_reported_not_dropped():
    entry = ArchEntry(
        "BrokenForCausalLM",
        "models.no_such_module",
        "Broken",
        ModelCapabilities(),
        TieSupport.BOTH,
        "broken",
    )
    registry.register(entry)
    try:
        assert "ModuleNotFoundError" in registry.import_failures()["BrokenForCausalLM"]
        with pytest.raises(ValueError, match="already registered"):
            registry.register(entry)
    finally:
        registry._REGISTRY.pop("BrokenForCausalLM")


def test_registry_imports_without_torch():
    code = "import sys, models.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
