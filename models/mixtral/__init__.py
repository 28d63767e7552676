"""Native Mixtral (Mistral attention, renormalised top-k router, grouped routed experts)."""

from models.mixtral.model import MixtralForCausalLM

__all__ = ["MixtralForCausalLM"]
