"""Native Llama (GQA, SwiGLU, RMSNorm, RoPE incl. llama3 and YaRN scaling)."""

from models.llama.model import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
