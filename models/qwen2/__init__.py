"""Native Qwen2 (Llama layout plus q/k/v projection bias)."""

from models.qwen2.model import Qwen2ForCausalLM

__all__ = ["Qwen2ForCausalLM"]
