"""Native Qwen3-MoE (Qwen3 attention, fp32 top-k router, grouped routed experts)."""

from models.qwen3_moe.model import Qwen3MoeForCausalLM

__all__ = ["Qwen3MoeForCausalLM"]
