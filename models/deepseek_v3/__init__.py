"""Native DeepSeek-V3 / Moonlight (multi-head latent attention, sigmoid group-limited MoE)."""

from models.deepseek_v3.model import DeepseekV3ForCausalLM

__all__ = ["DeepseekV3ForCausalLM"]
