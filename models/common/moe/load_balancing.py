"""The router's auxiliary loss: the Switch load-balancing loss and the model mixin that adds it.

MoE blocks that set `record_router_logits` keep their last forward's router logits;
`RouterAuxLossMixin` collects them after the forward, clears them, and with
`output_router_logits: true` adds `router_aux_loss_coef` x `load_balancing_loss` to the
language-model loss and returns it as `aux_loss`, as transformers does.
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import MoeCausalLMOutputWithPast


def load_balancing_loss(
    router_logits: list[torch.Tensor],
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Switch-Transformer load-balancing loss, summed over layers as transformers does:
    num_experts * sum_e(fraction of routed slots to e * mean router probability of e),
    counting only non-padding tokens when a mask is given."""
    device = router_logits[0].device
    tokens_per_expert = torch.zeros(num_experts, dtype=torch.float32, device=device)
    prob_per_expert = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = 0.0
    mask = None if attention_mask is None else attention_mask.reshape(-1).to(device, torch.float32)
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        chosen = torch.topk(probs, top_k, dim=-1).indices.reshape(-1)
        weight = (
            torch.ones_like(chosen, dtype=torch.float32)
            if mask is None
            else (mask.repeat_interleave(top_k))
        )
        tokens_per_expert = tokens_per_expert.scatter_add(0, chosen, weight)
        masked = probs if mask is None else probs * mask.unsqueeze(-1)
        prob_per_expert = prob_per_expert + masked.sum(dim=0)
        rows = rows + (probs.shape[0] if mask is None else mask.sum())
    return num_experts * torch.sum((tokens_per_expert / rows) * (prob_per_expert / rows))


class RouterAuxLossMixin:
    """Adds the Switch load-balancing loss (x `router_aux_loss_coef`) to the forward's output
    when `config.output_router_logits`, from the router logits every MoE block recorded
    (`router_logits`, cleared here). Mixed in before `NativeCausalLM` by MoE families."""

    def _output(
        self, loss: torch.Tensor | None, logits: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> MoeCausalLMOutputWithPast:
        blocks = [m for m in self.modules() if hasattr(m, "record_router_logits")]
        recorded = [b.router_logits for b in blocks if b.router_logits is not None]
        for block in blocks:
            block.router_logits = None
        aux = None
        if self.config.output_router_logits and recorded:
            aux = load_balancing_loss(
                recorded, self.config.num_experts, self.config.num_experts_per_tok, attention_mask
            )
            if loss is not None:
                loss = loss + self.config.router_aux_loss_coef * aux
        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux, logits=logits)
