"""Phi-3 (`Phi3ForCausalLM`): native model, rotary (partial, LongRoPE) and fused-weight adapter."""

from models.phi3.model import Phi3ForCausalLM

__all__ = ["Phi3ForCausalLM"]
