"""Fingerprint parts: a digest changes with any one value, dtype or shape and not with the
tensor's memory layout; rank digests combine in order; the comparison names each differing
tensor and the probe loss, ignores optimizer state a checkpoint did not keep, and compares
only the probe loss across meshes."""

from __future__ import annotations

import torch

from trainer.resilience.fingerprint import (
    clean_name,
    combine,
    differences,
    optimizer_digests,
    tensor_digest,
)


def test_a_digest_sees_one_value_dtype_and_shape_not_layout() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    changed = base.clone()
    changed[2, 3] += 1e-6
    assert tensor_digest(base) == tensor_digest(base.t().contiguous().t())  # same values
    assert tensor_digest(base) != tensor_digest(changed)
    assert tensor_digest(base) != tensor_digest(base.double())
    assert tensor_digest(base) != tensor_digest(base.reshape(4, 3))
    assert tensor_digest(base.bfloat16()) == tensor_digest(base.bfloat16().clone())


def test_hashing_leaves_the_tensor_storage_resizable() -> None:
    param = torch.zeros(8)
    tensor_digest(param)
    param.untyped_storage().resize_(0)  # FSDP2 frees unsharded storage this way


def test_differences_name_the_tensors_and_the_probe_loss() -> None:
    saved = {"parameters": {"a": "1", "b": "2"}, "optimizer": {"a.exp_avg": "3"},
             "probe_loss": 2.0}  # fmt: skip
    same = {"parameters": {"a": "1", "b": "2"}, "optimizer": {"a.exp_avg": "3"},
            "probe_loss": 2.0 * (1 + 1e-8)}  # fmt: skip
    assert differences(saved, same) == []
    now = {"parameters": {"a": "1", "b": "X"}, "optimizer": {"a.exp_avg": "Y"}, "probe_loss": 2.5}
    assert differences(saved, now) == [
        "parameters: b", "optimizer: a.exp_avg", "probe_loss: saved 2.0, recomputed 2.5"]  # fmt: skip
    fresh_optimizer = {**now, "parameters": saved["parameters"], "probe_loss": 2.0}
    assert differences({**saved, "optimizer": None}, fresh_optimizer) == []
    moved = {**now, "layout": {"world_size": 4}}  # shard digests of another mesh: probe only
    assert differences({**saved, "layout": {"world_size": 2}}, moved) == [
        "probe_loss: saved 2.0, recomputed 2.5"]  # fmt: skip


def test_rank_digests_combine_in_order_and_replicas_stay_one() -> None:
    assert combine(["a1", "a1"]) == "a1"
    assert combine(["a1", "b2"]) != combine(["b2", "a1"])


def test_optimizer_digests_are_named_by_parameter_and_key() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    names = set(optimizer_digests(model, optimizer))
    assert names == {
        f"{p}.{k}" for p in ("weight", "bias") for k in ("step", "exp_avg", "exp_avg_sq")
    }
    assert clean_name("model._checkpoint_wrapped_module.layers.0._orig_mod.w") == "model.layers.0.w"
