"""Native Gemma 2 (sandwich norms, GeGLU, local/global attention, tanh soft-capping)."""

from models.gemma2.model import Gemma2ForCausalLM

__all__ = ["Gemma2ForCausalLM"]
