"""Native Gemma 3 text (Gemma 2's stack with q/k norms and a RoPE per layer type)."""

from models.gemma3.model import Gemma3ForCausalLM

__all__ = ["Gemma3ForCausalLM"]
