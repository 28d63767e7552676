"""Checkpoints: consolidated safetensors for the model, DCP for the optimizer, atomic publish."""
