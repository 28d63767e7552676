"""Loss, LR schedule, gradient clipping, quantization refusal and the target signatures."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from torch.nn import functional as F

from jobs.recipe.exit_codes import ExitCode
from jobs.recipe.targets import TARGETS, load_callable
from trainer.builders import refuse_quantization
from trainer.errors import TrainerError
from trainer.loss import MaskedCrossEntropy, token_loss_sum
from trainer.parallelize import clip_grad_norm
from trainer.schedulers import CosineAnnealingWarmup


def test_masked_cross_entropy_ignores_masked_tokens() -> None:
    logits, labels = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    labels[0, :2] = -100
    keep = labels != -100
    expected = F.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(MaskedCrossEntropy()(logits, labels), expected)
    summed = MaskedCrossEntropy(reduction="sum")(logits, labels)
    torch.testing.assert_close(summed, expected * keep.sum())


def test_token_loss_sum_is_a_sum_for_any_reduction() -> None:
    logits, labels = torch.randn(1, 6, 7), torch.randint(0, 7, (1, 6))
    labels[0, 0] = -100
    a = token_loss_sum(torch.nn.CrossEntropyLoss(), logits, labels)
    b = token_loss_sum(MaskedCrossEntropy(reduction="sum"), logits, labels)
    torch.testing.assert_close(a, b)
    assert float(token_loss_sum(MaskedCrossEntropy(), logits, torch.full((1, 6), -100))) == 0.0


def test_cosine_warmup_schedule_and_exact_restore() -> None:
    def make():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return opt, CosineAnnealingWarmup(opt, warmup_steps=2, min_lr=0.1, max_steps=10)

    opt, sched = make()
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert lrs[-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 7 / 8)))
    opt2, sched2 = make()
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_clip_grad_norm_matches_torch() -> None:
    params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(4, 4) * 10
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for c, p in zip(copies, params, strict=True):
        c.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(copies, 1.0)
    assert clip_grad_norm(params, 1.0) == pytest.approx(float(expected), rel=1e-6)
    for c, p in zip(copies, params, strict=True):
        torch.testing.assert_close(p.grad, c.grad)


@pytest.mark.parametrize("section", ["fp8", "qat"])
def test_quantization_is_refused_on_cpu(section: str) -> None:
    with pytest.raises(TrainerError) as info:
        refuse_quantization({section: {"enabled": True}}, torch.device("cpu"))
    assert info.value.exit_code == ExitCode.UNSUPPORTED and section in info.value.message


def _specs(trainer_only: bool):
    specs = {spec.name: spec for spec in TARGETS.values() if spec.params is not None}
    chosen = [s for s in specs.values() if s.import_path.startswith("trainer.") or not trainer_only]
    return sorted(chosen, key=lambda s: s.name)


def _real_params(spec) -> tuple[set[str], bool, set[str]]:
    parameters = inspect.signature(load_callable(spec)).parameters
    plain = {
        n: p
        for n, p in parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in ("self", "cls")
    }
    has_kwargs = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
    required = {n for n, p in plain.items() if p.default is p.empty}
    return set(plain), has_kwargs, required


@pytest.mark.parametrize("spec", _specs(trainer_only=True), ids=lambda s: s.name)
def test_trainer_targets_param_table_equals_the_signature(spec) -> None:
    real, _, _ = _real_params(spec)
    declared = set(spec.params) | set(spec.injected)
    if spec.kind == "dataset" and "tokenizer" in real:
        declared.add("tokenizer")  # the trainer offers it to every dataset
    assert declared == real


@pytest.mark.parametrize("spec", _specs(trainer_only=False), ids=lambda s: s.name)
def test_every_allowlisted_keyword_is_accepted_by_the_callable(spec) -> None:
    real, has_kwargs, required = _real_params(spec)
    declared = set(spec.params) | set(spec.injected)
    assert has_kwargs or declared <= real, declared - real
    supplied = set(spec.required) | set(spec.injected) | {"tokenizer"}
    assert required <= supplied, required - supplied


def test_peft_with_tensor_parallel_is_refused() -> None:
    from trainer.setup import check_peft_parallelism

    with pytest.raises(TrainerError) as info:
        check_peft_parallelism({"peft": {"dim": 8}, "distributed": {"tp_size": 2}})
    assert info.value.exit_code == ExitCode.UNSUPPORTED and "tp_size" in info.value.message
    check_peft_parallelism({"peft": {"dim": 8}, "distributed": {"tp_size": 1}})
    with pytest.raises(TrainerError) as info:
        check_peft_parallelism({"peft": {"dim": 8}, "distributed": {"ep_size": 2}})
    assert info.value.exit_code == ExitCode.UNSUPPORTED and "ep_size" in info.value.message
    check_peft_parallelism({"distributed": {"ep_size": 2}})


def test_mixed_precision_policy_applies_on_cuda_only() -> None:
    from trainer.parallelize import _mp_policy

    section = {"mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}
    assert _mp_policy(section, torch.device("cpu")).param_dtype is None
    policy = _mp_policy(section, torch.device("cuda", 0))
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32


def test_data_position_is_rescaled_when_dp_size_changes() -> None:
    from trainer.setup import _data_position

    state = {"data": {"epoch": 1, "batches_done": 6}, "dp_size": 2}
    assert _data_position(state, 2) == {"epoch": 1, "batches_done": 6}
    assert _data_position(state, 4) == {"epoch": 1, "batches_done": 3}


def test_a_callable_refusing_its_arguments_is_a_recipe_error() -> None:
    from trainer.builders import build_target

    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(TrainerError) as info:
        build_target({"_target_": "torch.optim.AdamW", "lr": -1.0}, "optimizer", params=params)
    assert info.value.exit_code == ExitCode.INVALID_RECIPE
    assert info.value.message.startswith("optimizer: ") and "learning rate" in info.value.message


def test_a_backend_the_machine_cannot_run_is_refused() -> None:
    from trainer.distributed import DistEnv, check_backend

    cpu = DistEnv(0, 1, 0, 1, torch.device("cpu"))
    check_backend(cpu, {"backend": "gloo"})
    check_backend(cpu, None)
    with pytest.raises(TrainerError) as info:
        check_backend(cpu, {"backend": "nccl"})
    assert info.value.exit_code == ExitCode.UNSUPPORTED and "gloo" in info.value.message
