"""Native gpt-oss (attention sinks, sliding/full layers, biased top-k MoE with clamped SwiGLU)."""

from models.gpt_oss.model import GptOssForCausalLM

__all__ = ["GptOssForCausalLM"]
