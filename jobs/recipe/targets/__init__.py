"""The `_target_` allowlist: one spec per callable a recipe may name (tuneyard's builders,
torch, AutoModel's datasets and losses, operator plugins), where each may appear, the
keywords it takes, and how a checked section is built.
"""
