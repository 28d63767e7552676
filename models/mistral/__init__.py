"""Native Mistral (the Llama stack with sliding-window attention on every layer)."""

from models.mistral.model import MistralForCausalLM

__all__ = ["MistralForCausalLM"]
