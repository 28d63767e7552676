"""Resume proof: a fingerprint of the training state, stored with each checkpoint and
checked again after a resume before the first step.

The fingerprint has three parts: `parameters` (a SHA-256 of every trainable parameter, by
name), `optimizer` (the same for every optimizer state tensor, `<param>.<key>`, when the
checkpoint keeps optimizer state) and `probe_loss` (the loss of a fixed probe batch: the
dataset's first rows, the same on every rank, model in eval mode, no gradients, the RNG
untouched). Each rank hashes only the shards it holds (no gather: a save costs one pass
over this rank's memory) and the ranks' digests of a tensor combine in rank order, which
covers pipeline stages too (where there is no probe loss: stages cannot run one forward
alone). Shard digests depend on the mesh, so the fingerprint records its `layout` (world
size and mesh shape); a resume onto another layout compares the probe loss only and says
so. After a resume `verify_resume` recomputes the fingerprint and writes
`resume_verified`, or writes `resume_mismatch` naming the differing parts and fails.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from trainer.checkpoint import manager
from trainer.context_parallel import shard_batch
from trainer.distributed import all_reduce_sum
from trainer.errors import checkpoint_error
from trainer.forward import forward_logits
from trainer.loss import token_loss_sum
from trainer.train_state import capture_rng, restore_rng

PROBE_ROWS = 4  # rows of the probe batch (at most the local batch size)
PROBE_REL_TOL = 1e-6  # a float reduction: another mesh may sum in another order
WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
MAX_NAMED = 8  # differing tensors named per part


def clean_name(name: str) -> str:
    for part in WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 (first 16 hex digits) of this rank's part of a tensor: bytes, dtype, shape
    (and, for a DTensor, its placements)."""
    header = ""
    if isinstance(tensor, DTensor):
        header, tensor = str(tensor.placements), tensor.to_local()
    # a copy: numpy() would pin the storage, and FSDP2 frees and regrows parameter storage;
    # the copy is this function's own, so its buffer is hashed in place (no bytes object)
    data = tensor.detach().to("cpu", copy=True).contiguous()
    digest = hashlib.sha256(f"{header}{data.dtype}{tuple(data.shape)}".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def combine(per_rank: list[str]) -> str:
    """One digest for a tensor from its ranks' digests in rank order (one rank: itself)."""
    if len(set(per_rank)) == 1:
        return per_rank[0]  # replicated (or held by one rank)
    return hashlib.sha256("|".join(per_rank).encode()).hexdigest()[:16]


def _merged(local: dict[str, str]) -> dict[str, str]:
    """Every rank's {name: digest}, combined per name in rank order."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(sorted(local.items()))
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    names = sorted({name for part in gathered for name in part})
    return {n: combine([part[n] for part in gathered if n in part]) for n in names}


def parameter_digests(model: torch.nn.Module) -> dict[str, str]:
    local = {
        clean_name(name): tensor_digest(param)
        for name, param in model.named_parameters()
        if param.requires_grad
    }
    return _merged(local)


def optimizer_digests(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    local: dict[str, str] = {}
    for name, param in model.named_parameters():
        state = optimizer.state.get(param) or {}
        for key in sorted(state):
            value = state[key]
            if isinstance(value, torch.Tensor):
                local[f"{clean_name(name)}.{key}"] = tensor_digest(value)
    return _merged(local)


def probe_batch(run: Any) -> dict[str, Any]:
    dataset = run.train_loader.dataset
    rows = min(PROBE_ROWS, run.train_loader.batch_sampler.batch_size, len(dataset))
    return run.train_loader.collate_fn([dataset[i] for i in range(rows)])


@torch.no_grad()
def probe_loss(run: Any) -> float | None:
    """Loss per label token of the probe batch; None under pipeline parallelism."""
    if run.pipeline is not None:
        return None
    rng = capture_rng()
    was_training = run.model.training
    run.model.train(False)
    try:
        batch = shard_batch(probe_batch(run), run.topology)
        logits = forward_logits(run, batch)
        target = batch["labels"].to(run.env.device)
        loss_sum = float(token_loss_sum(run.loss_fn, logits, target))
        labels = int((batch["labels"] != -100).sum())
    finally:
        run.model.train(was_training)
        restore_rng(rng)
    loss_sum, labels = all_reduce_sum([loss_sum, labels], run.env.device)
    return loss_sum / max(1.0, labels)


def reshard(model: torch.nn.Module) -> None:
    """Put FSDP2's sharded parameters back on their modules. After a forward without a
    backward (validation) the root unit keeps its unsharded tensors registered instead,
    and those are not the parameters the optimizer state is keyed by."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def compute(run: Any) -> dict[str, Any]:
    """The fingerprint of `run`'s state now (collective: every rank calls it)."""
    reshard(run.model)
    optimizer = None
    if run.checkpoints.save_optimizer:
        optimizer = optimizer_digests(run.model, run.optimizer)
    return {
        "layout": layout(run),
        "parameters": parameter_digests(run.model),
        "optimizer": optimizer,
        "probe_loss": probe_loss(run),
    }


def layout(run: Any) -> dict[str, Any]:
    return {"world_size": run.env.world_size, "mesh_shape": run.topology.mesh_shape()}


def _digest_diff(part: str, saved: dict[str, str], now: dict[str, str]) -> list[str]:
    names = sorted(set(saved) | set(now))
    differing = [n for n in names if saved.get(n) != now.get(n)]
    if not differing:
        return []
    shown = ", ".join(differing[:MAX_NAMED])
    more = f" and {len(differing) - MAX_NAMED} more" if len(differing) > MAX_NAMED else ""
    return [f"{part}: {shown}{more}"]


def differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The parts of `now` that differ from `saved`, each naming what differs (digests only
    where both were taken on the same layout)."""
    diffs = []
    if saved.get("layout") == now.get("layout"):
        diffs += _digest_diff("parameters", saved.get("parameters") or {}, now["parameters"])
        if saved.get("optimizer") is not None and now.get("optimizer") is not None:
            diffs += _digest_diff("optimizer", saved["optimizer"], now["optimizer"])
    before, after = saved.get("probe_loss"), now.get("probe_loss")
    comparable = before is not None and after is not None
    if comparable and not math.isclose(before, after, rel_tol=PROBE_REL_TOL, abs_tol=1e-9):
        diffs.append(f"probe_loss: saved {before!r}, recomputed {after!r}")
    return diffs


def verify_resume(run: Any, log: Any) -> None:
    """After a resume: `resume_verified`, or `resume_mismatch` and a checkpoint error."""
    saved = manager.read_trainer_state(run.resumed_from).get("fingerprint")
    path = str(run.resumed_from)
    if not saved:
        log.event(
            "resume_unverified",
            run.step,
            path=path,
            message="the checkpoint has no fingerprint (saved before resume proofs)",
        )
        return
    now = compute(run)
    diffs = differences(saved, now)
    if not diffs:
        counts = {"parameters": len(now["parameters"]), "optimizer": len(now["optimizer"] or {})}
        same_layout = saved.get("layout") == now["layout"]
        compared = ["parameters", "optimizer", "probe_loss"] if same_layout else ["probe_loss"]
        log.event(
            "resume_verified",
            run.step,
            path=path,
            tensors=counts,
            compared=compared,
            probe_loss=now["probe_loss"],
        )
        return
    probe = {"saved": saved.get("probe_loss"), "recomputed": now["probe_loss"]}
    log.event(
        "resume_mismatch",
        run.step,
        path=path,
        parts=diffs,
        probe_loss=probe,
        message="; ".join(diffs),
    )
    raise checkpoint_error(
        f"resume_mismatch: the state restored from {path} differs from the state saved "
        f"({'; '.join(diffs)}); the checkpoint is damaged: resume from an earlier one "
        "(restore_from: {path: <checkpoints/step_N>})"
    )
