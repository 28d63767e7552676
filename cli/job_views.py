"""How the client commands show a job and a refusal, as text lines or JSON.

`status_lines` is `tuneyard status`: the job's state and attempts, the plan's key numbers
(model, ranks and mesh, batch arithmetic, steps, tokens, the estimate) and its last train
record. `summary_lines` is what `submit --wait` and `watch` print when the job has ended:
state, steps, final loss, the last checkpoint. `error_json` is a refusal as
`--json` prints it on stdout: the server's own error (`code`, `message`, and what it added:
`current_status`, `candidates`, field `errors`) plus the HTTP status and the exit code, so a
script reads one JSON document whatever happened. Every value from the server goes through
`cli.terminal.printable` before it is shown.
"""

from __future__ import annotations

from typing import Any

from cli.http_client import ClientError
from cli.terminal import printable

# The train record's fields `status` shows, in this order, with their formats.
METRIC_FORMATS = (
    ("loss", "{:.4f}"),
    ("lr", "{:.3g}"),
    ("grad_norm", "{:.3g}"),
    ("tps", "{:.0f}"),
    ("mfu", "{:.3f}"),
)


def _number(value: Any, fmt: str = "{}") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else printable(value)
    if isinstance(value, int) and fmt == "{}":
        return f"{value:,}"
    return fmt.format(value)


def _rows(pairs: list[tuple[str, str]]) -> list[str]:
    width = max(len(label) for label, _ in pairs)
    return [f"  {label.ljust(width)}  {value}" for label, value in pairs]


def progress_text(job: dict) -> str:
    step = (job.get("latest_metrics") or {}).get("step")
    return f"{_number(step or 0)}/{_number(job.get('max_steps')) if job.get('max_steps') else '?'}"


def plan_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """The plan's key numbers: what runs where, and how much of it."""
    sizes = ("dp", "tp", "pp", "cp", "ep")
    mesh = " ".join(f"{n}={plan[f'{n}_size']}" for n in sizes if plan.get(f"{n}_size"))
    ranks = f"{_number(plan.get('world_size'))} = {_number(plan.get('nnodes'))} node(s) x "
    ranks += f"{_number(plan.get('nproc_per_node'))} {printable(plan.get('accelerator') or '')}"
    rows = [
        ("model", f"{printable(plan.get('architecture') or '-')}"),
        ("parameters", _number(plan.get("param_count"))),
        ("ranks", ranks.rstrip()),
        ("parallelism", f"{printable(plan.get('strategy') or '-')} {printable(mesh)}".strip()),
        (
            "batch",
            f"global {_number(plan.get('global_batch_size'))} = local "
            f"{_number(plan.get('local_batch_size'))} x accumulation "
            f"{_number(plan.get('grad_accumulation_steps'))} x dp {_number(plan.get('dp_size'))}",
        ),
        ("max steps", _number(plan.get("max_steps"))),
        ("seq length", _number(plan.get("seq_length"))),
        ("tokens/step", _number(plan.get("tokens_per_step"))),
    ]
    estimate = plan.get("estimate") or {}
    memory = (estimate.get("memory_per_rank_bytes") or {}).get("total")
    if isinstance(memory, int | float):
        rows.append(("memory/rank", f"{memory / 2**30:.2f} GiB (estimate)"))
    if isinstance(estimate.get("eta_seconds"), int | float):
        rows.append(("time", f"{estimate['eta_seconds'] / 3600:.2f} h (estimate)"))
    return rows


def metric_rows(record: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The last train record: its step and the fields it carries."""
    if not record:
        return [("last step", "- (no train record yet)")]
    rows = [("last step", _number(record.get("step")))]
    rows += [(name, _number(record[name], fmt)) for name, fmt in METRIC_FORMATS if name in record]
    return rows


def status_lines(job: dict) -> list[str]:
    """`tuneyard status`: the job, its plan's key numbers and its last metrics."""
    lines = [f"{printable(job.get('name', ''))} {printable(job['id'])}"]
    head = [
        ("state", printable(job["status"])),
        ("attempt", f"{_number(job.get('attempt', 0))}/{_number(job.get('max_attempts'))}"),
        ("progress", progress_text(job)),
    ]
    if job.get("error_code") or job.get("error_message"):
        error = f"{printable(job.get('error_code'))}: {printable(job.get('error_message'))}"
        head.append(("error", error))
    lines += _rows(head)
    if job.get("plan"):
        lines += ["plan:", *_rows(plan_rows(job["plan"]))]
    lines += ["last metrics:", *_rows(metric_rows(job.get("latest_metrics")))]
    return lines


def summary_lines(job: dict, checkpoints: list[dict]) -> list[str]:
    """After a watched job ended: its steps, final loss and last checkpoint."""
    record = job.get("latest_metrics") or {}
    last = checkpoints[-1] if checkpoints else None
    checkpoint = f"{printable(last['path'])} (step {_number(last.get('step'))})" if last else "-"
    return _rows(
        [
            ("state", printable(job["status"])),
            ("steps", progress_text(job)),
            ("final loss", _number(record.get("loss"), "{:.4f}")),
            ("checkpoint", checkpoint),
        ]
    )


def error_json(error: ClientError) -> dict[str, Any]:
    """A refusal as `--json` prints it: `{"error": {...}}` with the server's fields."""
    detail: dict[str, Any] = {**error.detail, "code": error.code, "message": str(error)}
    if error.errors:
        detail["errors"] = error.errors
    if error.current_status:
        detail["current_status"] = error.current_status
    detail["http_status"] = error.http_status
    detail["exit_code"] = int(error.exit_code)
    return {"error": detail}
