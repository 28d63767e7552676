"""The plan `tuneyard validate` and the API show: what a job will run as.

World size and mesh shape from the DistributedSetup, batches and steps from the normalized
step scheduler, tokens per step (global batch x sequence length, where the sequence length
is known), where the model config is readable the architecture and parameter count, the
optional packages the job requires (`requires`: package -> the field that needs it), and the
`estimate` of memory per rank, FLOPs and time (`jobs.recipe.plan.estimate`).
Fields that cannot be known yet (an invalid topology, an uncached hub model) are null.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.plan.batches import seq_length_of
from jobs.recipe.plan.estimate import build_estimate
from jobs.recipe.plan.requirements import requirement_sources
from jobs.recipe.topology.setup import DistributedSetup

PLAN_KEYS = (
    "trust_remote_code",
    "world_size",
    "nnodes",
    "nproc_per_node",
    "accelerator",
    "strategy",
    "mesh_shape",
    "dp_size",
    "dp_replicate_size",
    "dp_shard_size",
    "tp_size",
    "pp_size",
    "cp_size",
    "ep_size",
    "grad_accumulation_steps",
    "global_batch_size",
    "local_batch_size",
    "max_steps",
    "seq_length",
    "tokens_per_step",
    "architecture",
    "param_count",
    "hub_revisions",
    "requires",
    "estimate",
)


def _topology(setup: DistributedSetup | None) -> dict[str, Any]:
    if setup is None:
        return {}
    s = setup.sizes
    return {
        "strategy": setup.strategy,
        "mesh_shape": setup.mesh_shape,
        "dp_size": setup.dp_size,
        "dp_replicate_size": s.dp_replicate_size,
        "dp_shard_size": setup.dp_shard_size,
        "tp_size": s.tp_size,
        "pp_size": s.pp_size,
        "cp_size": s.cp_size,
        "ep_size": s.ep_size,
    }


def build_plan(
    recipe: dict[str, Any] | None,
    setup: DistributedSetup | None,
    resources: Any,
    info: Any,
    flops_per_rank: float | None = None,
) -> dict[str, Any]:
    """Every PLAN_KEYS entry, null where unknown. `flops_per_rank` is the throughput the
    queue learned from its finished jobs (the estimate's time), None for the default."""
    plan: dict[str, Any] = dict.fromkeys(PLAN_KEYS)
    plan.update(
        world_size=resources.world_size,
        nnodes=resources.nnodes,
        nproc_per_node=resources.nproc_per_node,
        accelerator=resources.accelerator,
    )
    plan.update(_topology(setup))
    if recipe is None:
        return plan
    step = recipe.get("step_scheduler") or {}
    for key in ("grad_accumulation_steps", "global_batch_size", "local_batch_size", "max_steps"):
        plan[key] = step.get(key)
    plan["seq_length"] = seq_length_of(recipe)
    if plan["seq_length"] and plan["global_batch_size"]:
        plan["tokens_per_step"] = plan["seq_length"] * plan["global_batch_size"]
    if info is not None:
        plan["architecture"], plan["param_count"] = info.architecture, info.param_count
    plan["hub_revisions"] = recipe.get("hub_revisions") or {}  # the commits validation read
    plan["requires"] = requirement_sources(recipe)  # package -> the field that needs it
    config = info.config if info is not None else None
    plan["estimate"] = build_estimate(recipe, setup, plan, config, flops_per_rank)
    return plan
