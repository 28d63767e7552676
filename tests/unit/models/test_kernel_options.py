"""The loader's kernel options (models.common.kernels via models.auto): which modules a
`liger_kernel` swaps in and which calls it gets, proven with a fake `liger_kernel` module
in sys.modules (no kernel numerics: the fakes compute what the replaced layers compute),
and the fallbacks recorded when liger cannot run (the path that really runs on CPU)."""

from __future__ import annotations

import copy
import sys
import types
from typing import Any

import pytest
import torch
from torch import nn

from models.auto import AutoModelForCausalLM
from models.common import kernels
from models.common.layers import Attention, RMSNorm, SwiGLUMLP
from models.common.rope import apply_rotary

CONFIG = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def _fake_liger(calls: list[tuple[str, Any]]) -> types.ModuleType:
    """A stand-in for liger_kernel.transformers with its public names and signatures."""

    class LigerRMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama", **_):
            super().__init__()
            calls.append(("LigerRMSNorm", (hidden_size, eps, offset, casting_mode)))
            self.weight = nn.Parameter(torch.ones(hidden_size))
            self.variance_epsilon = eps

        def forward(self, x):
            return RMSNorm.forward(self, x)

    class LigerSwiGLUMLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            calls.append(("LigerSwiGLUMLP", config))
            self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
            self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
            self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        calls.append(("liger_rotary_pos_emb", tuple(q.shape)))
        return apply_rotary(q, k, cos, sin)

    def apply_liger_kernel_to_llama(
        rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
        swiglu=True, model=None,
    ):  # fmt: skip
        calls.append(("apply_liger_kernel_to_llama", dict(
            rope=rope, cross_entropy=cross_entropy, rms_norm=rms_norm, swiglu=swiglu,
            fused_linear_cross_entropy=fused_linear_cross_entropy, model=model)))  # fmt: skip

    module = types.ModuleType(kernels.LIGER_MODULE)
    module.LigerRMSNorm, module.LigerSwiGLUMLP = LigerRMSNorm, LigerSwiGLUMLP
    module.liger_rotary_pos_emb = liger_rotary_pos_emb
    module.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    return module


@pytest.fixture
def liger(monkeypatch) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    package = types.ModuleType("liger_kernel")
    package.transformers = _fake_liger(calls)
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, kernels.LIGER_MODULE, package.transformers)
    return calls


def _native(**options: Any) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(dict(CONFIG), **options)


def _logits(model: nn.Module) -> torch.Tensor:
    ids = torch.arange(12).reshape(2, 6) % 128
    with torch.no_grad():
        return model(ids).logits


def test_the_cpu_loader_falls_back_and_keeps_its_layers():
    model = _native(use_liger_kernel=True)
    assert model.tuneyard_backend == "native"
    [(option, reason)] = model.tuneyard_kernel_fallbacks
    assert option == "use_liger_kernel" and "CUDA" in reason and "cpu" in reason
    assert sum(type(m) is RMSNorm for m in model.modules()) == 5  # 2 per layer + final
    assert model.tuneyard_kernels == []
    assert torch.equal(_logits(model), _logits(_native()))


def test_no_liger_kernel_package_is_a_fallback_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, kernels.LIGER_MODULE, None)  # import raises ImportError
    model = _native()
    kernels.apply_kernel_options(model, kernels.KernelOptions(use_liger_kernel=True), "cuda")
    [(option, reason)] = model.tuneyard_kernel_fallbacks
    assert option == "use_liger_kernel" and "cannot be imported" in reason
    assert "pip install liger-kernel" in reason
    assert all(type(m).__module__ == "models.common.layers" for m in model.modules()
               if type(m).__name__ in ("RMSNorm", "SwiGLUMLP"))  # fmt: skip


def test_native_swap_replaces_norms_mlps_and_rope_keeping_the_weights(liger):
    model = _native()
    before = {name: p for name, p in model.named_parameters()}
    expected = _logits(model)
    kernels.apply_kernel_options(model, kernels.KernelOptions(use_liger_kernel=True), "cuda")
    assert model.tuneyard_kernel_fallbacks == []
    kinds = [type(m).__name__ for m in model.modules()]
    assert kinds.count("LigerRMSNorm") == 5 and "RMSNorm" not in kinds
    assert kinds.count("LigerSwiGLUMLP") == 2 and "SwiGLUMLP" not in kinds
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is param for name, param in before.items())  # same tensors
    norm_args = [args for name, args in liger if name == "LigerRMSNorm"]
    assert norm_args[0] == (32, 1e-6, 0.0, "llama")
    [mlp_config, _] = [c for name, c in liger if name == "LigerSwiGLUMLP"]
    assert (mlp_config.hidden_size, mlp_config.intermediate_size, mlp_config.hidden_act) == (
        32, 64, "silu")  # fmt: skip
    assert all(m.rotary_fn is not None for m in model.modules() if isinstance(m, Attention))
    assert torch.allclose(_logits(model), expected, atol=1e-6)  # the fakes compute the same
    assert [s for name, s in liger if name == "liger_rotary_pos_emb"] == [(2, 4, 6, 8)] * 2
    assert model.tuneyard_kernels == ["LigerRMSNorm x5", "LigerSwiGLUMLP x2",
                                      "liger_rotary_pos_emb x2"]  # fmt: skip


def test_a_failing_replacement_leaves_the_model_untouched(liger, monkeypatch):
    module = sys.modules[kernels.LIGER_MODULE]

    def broken(config):
        raise ValueError("hidden_act not supported")

    monkeypatch.setattr(module, "LigerSwiGLUMLP", broken)
    model = _native()
    kernels.apply_kernel_options(model, kernels.KernelOptions(use_liger_kernel=True), "cuda")
    [(option, reason)] = model.tuneyard_kernel_fallbacks
    assert option == "use_liger_kernel" and "hidden_act not supported" in reason
    assert sum(type(m) is RMSNorm for m in model.modules()) == 5
    assert sum(type(m) is SwiGLUMLP for m in model.modules()) == 2
    assert all(m.rotary_fn is None for m in model.modules() if isinstance(m, Attention))


def test_hf_class_gets_liger_s_family_patch_without_the_loss(liger):
    model = _native(force_hf=True)
    assert model.tuneyard_backend == "hf"
    kernels.apply_kernel_options(model, kernels.KernelOptions(use_liger_kernel=True), "cuda")
    [(name, flags)] = liger
    assert name == "apply_liger_kernel_to_llama" and flags["model"] is model
    assert flags["rope"] and flags["rms_norm"] and flags["swiglu"]
    assert not flags["fused_linear_cross_entropy"] and not flags["cross_entropy"]
    assert model.tuneyard_kernels == ["apply_liger_kernel_to_llama"]


def test_hf_family_liger_has_no_patch_for_is_a_fallback(liger):
    model = _native(force_hf=True)
    model.config.model_type = "no_such_family"
    kernels.apply_kernel_options(model, kernels.KernelOptions(use_liger_kernel=True), "cuda")
    [(option, reason)] = model.tuneyard_kernel_fallbacks
    assert "apply_liger_kernel_to_no_such_family" in reason and liger == []


def test_sdpa_patching_builds_hf_with_sdpa_and_falls_back_on_cpu():
    model = _native(force_hf=True, use_sdpa_patching=True)
    assert model.config._attn_implementation == "sdpa"
    [(option, reason)] = model.tuneyard_kernel_fallbacks
    assert option == "use_sdpa_patching" and "CUDA only" in reason and "sdpa is selected" in reason


def test_sdpa_patching_on_cuda_runs_each_layer_under_sdpa_kernel(monkeypatch):
    import contextlib

    import torch.nn.attention as attention

    entered: list[list[Any]] = []

    @contextlib.contextmanager
    def recording(backends, set_priority=False):
        entered.append(list(backends))
        yield

    monkeypatch.setattr(attention, "sdpa_kernel", recording)
    model = _native()
    options = kernels.KernelOptions(use_sdpa_patching=True, sdpa_method=("flash_attention", "math"))
    kernels.apply_kernel_options(model, options, "cuda")
    assert model.tuneyard_kernel_fallbacks == []
    _logits(model)
    backends = [attention.SDPBackend.FLASH_ATTENTION, attention.SDPBackend.MATH]
    assert entered == [backends, backends]  # once per decoder layer
    copied = copy.deepcopy(model)  # a pipeline split copies: the wrapper follows the copy
    assert all(layer.forward.__self__ is layer for layer in copied.model.layers)
    assert torch.equal(_logits(copied), _logits(model)) and len(entered) == 6


def test_the_default_sdpa_method_is_automodel_s():
    from torch.nn.attention import SDPBackend

    assert kernels.sdpa_backends(kernels.DEFAULT_SDPA_METHOD) == [
        SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
    ]  # fmt: skip


def test_pop_kernel_options_leaves_the_model_kwargs():
    kwargs = {"use_liger_kernel": True, "sdpa_method": ["MATH"], "rms_norm_eps": 1e-5}
    options = kernels.pop_kernel_options(kwargs)
    assert options == kernels.KernelOptions(True, False, ("math",))
    assert kwargs == {"rms_norm_eps": 1e-5}


def test_the_trainer_reports_one_event_per_fallback():
    from trainer.builders import report_kernel_fallbacks

    class Log:
        events: list[tuple[str, int, dict[str, Any]]] = []

        def event(self, name: str, step: int, **fields: Any) -> None:
            self.events.append((name, step, fields))

    log = Log()
    report_kernel_fallbacks(_native(use_liger_kernel=True), log, 0)
    [(name, step, fields)] = log.events
    assert (name, step, fields["option"]) == ("kernel_fallback", 0, "model.use_liger_kernel")
    assert "CUDA" in fields["message"]


def test_an_hf_class_without_sdpa_builds_with_its_default_and_reports_once():
    from models import auto

    asked: list[dict[str, Any]] = []

    def build(**kwargs: Any) -> nn.Module:
        asked.append(kwargs)
        if kwargs.get("attn_implementation") == "sdpa":
            raise ValueError("FooForCausalLM does not support an attention implementation "
                             "through torch.nn.functional.scaled_dot_product_attention yet")  # fmt: skip
        return _native(force_hf=True)

    options = kernels.KernelOptions(use_sdpa_patching=True)
    model = auto._build_hf(build, options, None)
    assert asked == [{"attn_implementation": "sdpa"}, {}]
    [(option, reason)] = model.tuneyard_kernel_fallbacks
    assert option == "use_sdpa_patching" and "cannot run sdpa" in reason
    with pytest.raises(ValueError):  # the recipe's own choice is not retried
        auto._build_hf(build, options, "sdpa")
