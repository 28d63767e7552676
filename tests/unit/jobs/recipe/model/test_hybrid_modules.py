"""The torch-free module list of each hybrid family against transformers and peft themselves.

For every tiny config (and its variants), `hybrid_modules` names exactly the modules the
Hugging Face class builds, with the same `nn.Linear` ones. For every family, each kind of
module the list refuses is refused by peft at `get_peft_model`, or is wrapped but never
trains (no gradient reaches its adapter; for the fused-kernel ones, with the kernel stood in
for by a function that takes the weights as the real one does); every module it accepts is
wrapped and trains in one forward and backward step.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hybrid_tiny_configs import all_cases, config_json

from jobs.recipe.model.hybrid_modules import (
    DIRECT_WEIGHT,
    FUSED_KERNEL,
    UNUSED_SLOT,
    Module,
    hybrid_modules,
)
from jobs.recipe.model.lora_targets import lora_target_errors
from jobs.recipe.typed import Peft

UNTRAINED = (DIRECT_WEIGHT, FUSED_KERNEL, UNUSED_SLOT)


def _build(model_type: str, fields: dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))


@pytest.mark.parametrize("case", sorted(all_cases()))
def test_the_module_list_is_the_hugging_face_classes(case: str) -> None:
    from torch import nn

    model_type, fields = all_cases()[case]
    model = _build(model_type, fields)
    built = {name: isinstance(m, nn.Linear) for name, m in model.named_modules() if name}
    listed = hybrid_modules({"model_type": model_type, **fields})
    assert listed is not None
    assert {m.name: m.linear for m in listed} == built


def _peft_outcome(model, names: list[str]) -> str:
    """'refused' (get_peft_model raises ValueError), 'untrained' (an adapter gets no
    gradient from one step), or 'trains'; `names` empty: the model has its adapters."""
    import torch
    from peft import LoraConfig, get_peft_model

    if names:
        pattern = "|".join(re.escape(n) for n in names)
        try:
            model = get_peft_model(model, LoraConfig(r=2, target_modules=pattern))
        except ValueError:
            return "refused"
    ids = torch.randint(0, 64, (2, 12))
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss  # as the trainer calls it
    if not loss.requires_grad:  # no adapter is on the path to the loss at all
        return "untrained"
    loss.backward()
    adapters = [p for n, p in model.named_parameters() if "lora_B" in n]
    return (
        "trains"
        if all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapters)
        else "untrained"
    )


def _fake_mamba2_kernel(zxbcdt, *args, outproj_weight=None, outproj_bias=None, **kwargs):
    """Mamba-2's fused split-conv-scan kernel in shape: takes out_proj's weight, as it does."""
    import torch.nn.functional as F

    return F.linear(zxbcdt[..., : outproj_weight.shape[1]], outproj_weight, outproj_bias)


def _fake_mamba1_kernel(projected, conv_w, conv_b, x_proj_w, dt_proj_w, out_w, *args, **kwargs):
    """Mamba-1's fused inner kernel in shape: takes x_proj, dt_proj and out_proj weights."""
    import torch.nn.functional as F

    tied = (x_proj_w.sum() + dt_proj_w.sum()) * 0
    return F.linear(projected.transpose(1, 2)[..., : out_w.shape[1]], out_w) + tied


@contextmanager
def _fused_kernel(model_type: str) -> Iterator[None]:
    """The family's fused training kernel stood in for, as where mamba-ssm is installed."""
    import importlib

    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    name, fake = (
        ("mamba_inner_fn", _fake_mamba1_kernel)
        if hasattr(module, "mamba_inner_fn")
        else ("mamba2_split_conv1d_scan_combined", _fake_mamba2_kernel)
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, name, fake)
        yield


def _expected(module: Module) -> str:
    if module.refusal is None:
        return "trains"
    return "untrained" if module.refusal in UNTRAINED else "refused"


def _by_kind(modules: list[Module]) -> dict[str, list[Module]]:
    """The model's modules grouped by their name below the layer index and their refusal
    (a Zamba2 adapter slot is used in one hybrid layer and dead in the others)."""
    kinds: dict[str, list[Module]] = {}
    for module in modules:
        kinds.setdefault(f"{module.layer_name} ({module.refusal})", []).append(module)
    return kinds


@pytest.mark.parametrize("case", sorted(all_cases()))
def test_what_the_list_refuses_peft_refuses_or_never_trains(case: str) -> None:
    model_type, fields = all_cases()[case]
    model = _build(model_type, fields)
    modules = hybrid_modules({"model_type": model_type, **fields})
    assert modules is not None
    outcomes, expected = {}, {}
    for kind, members in _by_kind(modules).items():
        if members[0].refusal is None:
            continue
        expected[kind] = _expected(members[0])
        with _fused_kernel(model_type) if members[0].refusal == FUSED_KERNEL else _nothing():
            outcomes[kind] = _peft_outcome(copy.deepcopy(model), [m.name for m in members])
    trainable = [m.name for m in modules if m.refusal is None and m.linear]
    outcomes["every trainable linear"] = _peft_outcome(copy.deepcopy(model), trainable)
    expected["every trainable linear"] = "trains"
    assert outcomes == expected


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def test_a_config_of_another_architecture_or_family_has_no_list() -> None:
    assert hybrid_modules({"model_type": "llama", "num_hidden_layers": 2}) is None
    remote = config_json("nemotron_h", architectures=["NemotronHForCausalLMRemote"])
    assert hybrid_modules(remote) is None
    assert hybrid_modules(config_json("falcon_h1", num_hidden_layers=10**6)) is None  # too many


def _peft(**fields) -> Peft:
    base = dict(target_modules=None, exclude_modules=None, match_all_linear=None, dim=2,
                alpha=4.0, dropout=0.0, dropout_position="post", use_dora=False,
                use_triton=False)  # fmt: skip
    return Peft(**{**base, **fields})


def _fixed(peft: dict, fix: str) -> dict:
    """`peft` with the error's fix applied ("set peft.<key>: [...]")."""
    key, _, value = fix.removeprefix("set peft.").partition(": ")
    patterns = ast.literal_eval(value.split(" and ")[0])
    return {**peft, key: patterns, **({"match_all_linear": False} if " and " in value else {})}


def _trainer_outcome(model, model_type: str, peft: dict) -> str:
    """What the trainer's peft setup does with `peft`: 'refused', 'untrained' or 'trains'."""
    from trainer.builders import apply_peft
    from trainer.errors import TrainerError

    try:
        model = apply_peft(model, _peft(**peft))
    except TrainerError:
        return "refused"
    with _fused_kernel(model_type):
        return _peft_outcome(model, [])


@pytest.mark.parametrize("case", sorted(all_cases()))
@pytest.mark.parametrize("peft", [{"target_modules": ["*_proj"]}, {"match_all_linear": True}])
def test_a_refused_recipe_fails_in_the_trainer_and_its_fix_trains(case: str, peft: dict) -> None:
    model_type, fields = all_cases()[case]
    model = _build(model_type, fields)
    [error] = lora_target_errors({"model_type": model_type, **fields}, peft, {})
    assert _trainer_outcome(copy.deepcopy(model), model_type, peft) != "trains"
    assert (
        lora_target_errors({"model_type": model_type, **fields}, _fixed(peft, error.fix), {}) == []
    )
    assert _trainer_outcome(model, model_type, _fixed(peft, error.fix)) == "trains"
