"""`tuneyard validate`: check a recipe (plus overrides) for given resources, without torch.

Exit 0 when valid, 2 when not. `--json` prints exactly one JSON object
`{"valid", "errors": [{"loc", "msg", "fix"}], "warnings": [...], "plan"}`; otherwise a
readable report with every error and warning at once (what a recipe put in them escaped by
`cli.terminal.printable`), the plan and its estimate (memory per rank, FLOPs, time). `--device-memory 80GiB` refuses a recipe whose estimate cannot fit
one device, at `distributed`, with the cheapest fixes. Warnings (what was
accepted but is not used) never make a recipe invalid. Overrides follow the recipe path in the seed's CLI form
(`--optimizer.lr 1e-4`, `--step_scheduler.max_steps=500`, a bare `--flag`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from cli.terminal import printable
from jobs.recipe.plan.memory_fit import parse_memory_size
from jobs.recipe.plan.requirements import local_requirement_warnings
from jobs.recipe.validation import ValidationResult, validate_job

EXIT_INVALID = 2


def _report(recipe: Path, result: ValidationResult) -> str:
    lines = []
    if result.valid:
        lines.append(f"{recipe}: valid")
    else:
        count = len(result.errors)
        lines.append(f"{recipe}: invalid ({count} error{'s' if count != 1 else ''})")
        for err in result.errors:
            lines.append(f"  {printable(err.loc)}: {printable(err.msg)}")
            if err.fix:
                lines.append(f"      fix: {printable(err.fix)}")
    for warning in result.warnings:
        lines.append(f"  warning: {printable(warning.loc)}: {printable(warning.msg)}")
        if warning.fix:
            lines.append(f"      fix: {printable(warning.fix)}")
    plan = {k: v for k, v in result.plan.items() if k not in ("warnings", "estimate")}
    lines.append("plan:")
    width = max(len(k) for k in plan) if plan else 0
    for key, value in plan.items():
        shown = "-" if value is None else printable(_format(value))
        lines.append(f"  {key.ljust(width)}  {shown}")
    return "\n".join(lines + _estimate_lines(result.plan.get("estimate")))


def _estimate_lines(estimate: dict[str, Any] | None) -> list[str]:
    """The estimate in GiB and hours; what it assumes is in --json's `basis`."""
    if not estimate:
        return ["estimate: - (the model's sizes or the sequence length are unknown here)"]
    memory = estimate["memory_per_rank_bytes"]
    parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in memory.items() if k != "total")
    lines = [
        "estimate:",
        f"  memory per rank  {memory['total'] / 2**30:.2f} GiB ({parts})",
        f"  flops per step   {estimate['flops_per_step']:.3g}",
        f"  step / eta       {estimate['step_seconds']:.3g} s / {estimate['eta_seconds']:.3g} s"
        f" ({estimate['device_hours']:.3g} device-hours, throughput "
        f"{estimate['basis']['throughput']})",
    ]
    fit = estimate.get("fit")
    if fit:
        verdict = "fits" if fit["fits"] else "does not fit"
        lines.append(f"  device           {fit['device_memory_bytes'] / 2**30:.2f} GiB: {verdict}")
    return lines


def _format(value: Any) -> str:
    if isinstance(value, dict):
        return " x ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{value:,}"
    return str(value)


def validate(
    ctx: typer.Context,
    recipe: Path = typer.Argument(
        ..., help="Recipe YAML or JSON file.", metavar="RECIPE [OVERRIDES]...", show_default=False
    ),
    nproc_per_node: int = typer.Option(1, "--nproc-per-node", help="Processes per node."),
    nnodes: int = typer.Option(1, "--nnodes", help="Number of nodes."),
    accelerator: str = typer.Option("cpu", "--accelerator", help="cpu or cuda."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    device_memory: str | None = typer.Option(
        None,
        "--device-memory",
        help="Memory of one device (80GiB, 24GB, 512MiB): refuse a job whose estimate "
        "cannot fit, with the cheapest fixes.",
    ),
) -> None:
    """Check a recipe for these resources and print the plan (exit 0 valid, 2 invalid).

    Overrides follow the recipe path: --optimizer.lr 1e-4, --step_scheduler.max_steps=500,
    or a bare --flag for true.
    """
    resources = {"nnodes": nnodes, "nproc_per_node": nproc_per_node, "accelerator": accelerator}
    memory = parse_memory_size(device_memory) if device_memory is not None else None
    if device_memory is not None and memory is None:
        typer.echo(f"--device-memory: cannot read {device_memory!r}; give e.g. 80GiB", err=True)
        raise typer.Exit(EXIT_INVALID)
    result = validate_job(recipe, list(ctx.args), resources, device_memory=memory)
    _add_local_requirement_warnings(result)
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
    else:
        typer.echo(_report(recipe, result))
    if not result.valid:
        raise typer.Exit(EXIT_INVALID)


def _add_local_requirement_warnings(result: ValidationResult) -> None:
    """Without a server no worker can be asked: say which packages this interpreter lacks."""
    found = local_requirement_warnings(result.plan.get("requires") or {})
    result.warnings.extend(found)
    result.plan["warnings"] = [*result.plan.get("warnings", []), *(w.to_dict() for w in found)]


def register(app: typer.Typer) -> None:
    app.command(
        "validate",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(validate)
