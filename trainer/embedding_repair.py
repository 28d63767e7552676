"""Repair of near-zero input-embedding rows on the freshly loaded model (`embedding_row_repair:`).

Some checkpoints ship a few input-embedding rows that are zero or non-finite; the first
batch holding such a token then gives extreme gradients. `repair_embedding_rows` runs once
in `trainer.setup`, on the whole tensors of the base model as loaded (before PEFT, before
the pipeline split and sharding; validation's section is `jobs.recipe.sections.
embedding_row_repair`): a row whose L2 norm is non-finite or at most `min_norm` is replaced
by the matching output-embedding row, rescaled to the RMS L2 norm of the healthy input
rows, so the token keeps a direction of its own at the magnitude the model expects. More
than `max_rows` such rows, an output row that is itself damaged (always the case for a
tied embedding, where both are one tensor), or no output embedding at all stop the run
before any weight changes. A resumed run repairs its base load too and then loads the
checkpoint over it, so full weights resume as saved and a LoRA run's frozen base is the
repaired one again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from jobs.recipe.typed import EmbeddingRowRepair
from trainer.errors import data_error

FIX = "repair the checkpoint's embedding rows before submitting, or remove embedding_row_repair"


@dataclass(frozen=True)
class RepairReport:
    """What was repaired: the global row ids, the smallest norm before, the target norm."""

    input_name: str
    output_name: str | None
    row_ids: tuple[int, ...]
    min_norm_before: float
    target_norm: float | None


def _named_weight(model: nn.Module, module: nn.Module | None, suffixes: tuple[str, ...]):
    """(weight, name) of `module`'s weight among the model's parameters, else the first
    parameter whose name ends in one of `suffixes`; (None, None) when there is none."""
    named = list(model.named_parameters(remove_duplicate=False))
    wanted = getattr(module, "weight", None) if module is not None else None
    for name, param in named:
        if wanted is not None and param is wanted:
            return param, name
    for name, param in named:
        if name.endswith(suffixes):
            return param, name
    return None, None


def _embedding_weights(model: nn.Module):
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    found_in = _named_weight(
        model, get_in() if callable(get_in) else None, ("embed_tokens.weight",)
    )
    found_out = _named_weight(model, get_out() if callable(get_out) else None, ("lm_head.weight",))
    return found_in, found_out


def _row_squares(weight: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row, summed in float64 (a bf16 table sums without loss)."""
    return weight.detach().to(torch.float32).square().sum(dim=1, dtype=torch.float64)


def _damaged(norms: torch.Tensor, min_norm: float) -> torch.Tensor:
    return ~torch.isfinite(norms) | (norms <= min_norm)


def _ids(mask: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.nonzero(mask).flatten().tolist()]


def _shown(ids: list[int], limit: int = 20) -> str:
    """The ids, the first `limit` of a longer list and how many there are in all."""
    return str(ids) if len(ids) <= limit else f"{ids[:limit]} ... ({len(ids)} in all)"


def _check_source(name: str | None, weight: torch.Tensor | None, shape: tuple) -> None:
    if weight is None:
        raise data_error(
            "embedding_row_repair: the model has no output embedding (lm_head) to take the "
            "damaged rows' direction from",
            FIX,
        )
    if tuple(weight.shape) != shape or weight.ndim != 2:
        raise data_error(
            f"embedding_row_repair: the output embedding {name} has shape "
            f"{tuple(weight.shape)}, the input embedding {shape}; rows cannot be matched",
            FIX,
        )


@torch.no_grad()
def repair_rows(model: nn.Module, min_norm: float, max_rows: int) -> RepairReport:
    """Rewrite the damaged input-embedding rows of `model` in place (see the module)."""
    (weight, name), (source, source_name) = _embedding_weights(model)
    if weight is None or weight.ndim != 2 or not weight.is_floating_point():
        raise data_error("embedding_row_repair: the model has no input embedding matrix", FIX)
    squares = _row_squares(weight)
    norms = squares.sqrt()
    damaged = _damaged(norms, min_norm)
    row_ids, min_before = _ids(damaged), float(norms.min())
    if not row_ids:
        return RepairReport(name, None, (), min_before, None)
    if len(row_ids) > max_rows:
        raise data_error(
            f"embedding_row_repair: refusing to repair {len(row_ids)} input embedding rows "
            f"(max_rows is {max_rows}); that many usually means a mismatched or corrupted "
            "checkpoint",
            "check the checkpoint, or raise embedding_row_repair.max_rows if the rows are "
            "truly damaged",
        )
    _check_source(source_name, source, tuple(weight.shape))
    tied = source is weight or source.data_ptr() == weight.data_ptr()
    source_norms = _row_squares(source).sqrt()
    unusable = _ids(damaged & _damaged(source_norms, min_norm))
    if unusable:
        why = " (the output embedding is tied to the input embedding)" if tied else ""
        raise data_error(
            "embedding_row_repair: cannot repair input embedding rows because the "
            f"corresponding output rows are also damaged{why}: {_shown(unusable)}",
            FIX,
        )
    healthy = ~damaged
    if not bool(healthy.any()):
        raise data_error("embedding_row_repair: the input embedding has no healthy rows", FIX)
    # the mean of finite squares each above min_norm**2: finite and above min_norm
    target = math.sqrt(float(squares[healthy].sum() / healthy.sum()))
    index = torch.tensor(row_ids, device=weight.device)
    scale = (target / source_norms[damaged]).to(torch.float32).unsqueeze(1)
    rows = source.detach()[damaged].to(torch.float32) * scale
    weight.index_copy_(0, index, rows.to(weight.dtype))
    failed = _ids(damaged & _damaged(_row_squares(weight).sqrt(), min_norm))
    if failed:
        raise data_error(
            f"embedding_row_repair: rows {_shown(failed)} are still damaged after repair "
            f"(at the healthy rows' RMS norm {target:.3e} in {weight.dtype})",
            FIX,
        )
    return RepairReport(name, source_name, tuple(row_ids), min_before, target)


def repair_embedding_rows(
    model: nn.Module, config: EmbeddingRowRepair | None, is_rank0: bool
) -> RepairReport | None:
    """Repair `model`'s input embedding as the recipe asks (None without the section) and
    print on rank 0 how many rows were repaired."""
    if config is None:
        return None
    report = repair_rows(model, config.min_norm, config.max_rows)
    if not is_rank0:
        return report
    if report.row_ids:
        print(
            f"embedding_row_repair: repaired {len(report.row_ids)} input embedding row(s) in "
            f"{report.input_name} from {report.output_name}: ids={list(report.row_ids)}, "
            f"minimum_before={report.min_norm_before:.3e}, target_norm={report.target_norm:.3e}",
            flush=True,
        )
    else:
        print(
            f"embedding_row_repair: repaired 0 input embedding rows: none in "
            f"{report.input_name} at or below norm {config.min_norm:.3e} "
            f"(minimum {report.min_norm_before:.3e})",
            flush=True,
        )
    return report
