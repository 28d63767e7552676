"""Worker for test_context_parallel_attention: two gloo ranks run a native model context-parallel.

`python _cp_worker.py RANK WORLD PORT OUT CASE...`; a case is `FAMILY[:SEQ[:KV_HEADS[:packed]]]`
(KV_HEADS 0: the config's own; `packed`: rows of several documents, position ids restarting).
Both ranks build the same seeded model twice: one reference, one whose attention layers
attend context-parallel over the two ranks. Each rank feeds its load-balanced slice of the
ids, with the global position ids of those tokens; the gathered logits, the loss (each
rank's token-loss sum over the global label count, summed over ranks) and every parameter
gradient (summed over ranks) must equal the single-process model's to 1e-5 in fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_cases import run_cases


def _gather_logits(local: torch.Tensor) -> torch.Tensor:
    from models.common.context_parallel import _to_global_order

    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return _to_global_order(parts, dim=1)


def packed_positions(seq: int) -> torch.Tensor:
    """Row 0 holds documents of uneven lengths (one crossing the chunk boundaries), row 1 one."""
    lengths = [seq // 4 + 1, seq // 2, seq - seq // 4 - 1 - seq // 2]
    row = torch.cat([torch.arange(n) for n in lengths])
    return torch.stack([row, torch.arange(seq)])


def check(family: str, seq: int, kv_heads: int | None, packed: bool) -> None:
    from tiny_model_configs import make_config

    from models import AutoModelForCausalLM
    from models.common.context_parallel import enable_context_parallel, sequence_indices

    overrides = {"num_key_value_heads": kv_heads} if kv_heads else {}
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(make_config(family, **overrides))
    model = AutoModelForCausalLM.from_config(make_config(family, **overrides))
    model.load_state_dict(reference.state_dict())
    assert enable_context_parallel(model, dist.group.WORLD) == 2  # one per decoder layer
    torch.manual_seed(1)
    ids = torch.randint(1, 512, (2, seq))
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = -100
    labels[0, : seq // 3] = -100  # a prompt: unequal label counts on the two ranks
    positions = packed_positions(seq) if packed else torch.arange(seq).expand(2, -1)
    ref_logits = reference(input_ids=ids, position_ids=positions if packed else None).logits
    ref_loss = F.cross_entropy(ref_logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    ref_loss.backward()

    index = sequence_indices(seq, dist.get_rank(), dist.get_world_size())
    logits = model(input_ids=ids[:, index], position_ids=positions[:, index]).logits
    torch.testing.assert_close(_gather_logits(logits.detach()), ref_logits, atol=1e-5, rtol=1e-5)
    local = labels[:, index]
    loss_sum = F.cross_entropy(logits.flatten(0, 1), local.flatten(), reduction="sum")
    loss = loss_sum / int((labels != -100).sum())
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    torch.testing.assert_close(total, ref_loss.detach(), atol=1e-5, rtol=0)
    ref_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        grad = param.grad.clone()
        dist.all_reduce(grad)
        torch.testing.assert_close(grad, ref_grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def run_case(case: str) -> None:
    family, *rest = case.split(":")
    seq = int(rest[0]) if rest else 16
    kv_heads = int(rest[1]) if len(rest) > 1 and rest[1] != "0" else None
    check(family, seq, kv_heads, packed=rest[2:] == ["packed"])


if __name__ == "__main__":
    run_cases(run_case)
