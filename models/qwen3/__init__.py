"""Native Qwen3 (Llama layout plus per-head RMSNorm on q and k)."""

from models.qwen3.model import Qwen3ForCausalLM

__all__ = ["Qwen3ForCausalLM"]
