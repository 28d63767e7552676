"""Tiny config.json dicts of the hybrid (Mamba/attention) families, as validation reads them.

Each builds with transformers' own config class (`AutoConfig.for_model`) and mixes its layer
kinds: Mamba and attention layers, routed experts where the family has them. `VARIANTS`
spell the layer mix the other ways configs on the hub do (a `hybrid_override_pattern`,
legacy layer names, shared-attention adapters, rope, no experts).
"""

from __future__ import annotations

from typing import Any

_DENSE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=2)  # fmt: skip

CONFIGS: dict[str, dict[str, Any]] = {
    "falcon_h1": dict(_DENSE, num_hidden_layers=2, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4,
                      mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=8),
    "nemotron_h": dict(_DENSE, head_dim=8, num_hidden_layers=4,
                       layers_block_type=["mamba", "attention", "moe", "mlp"], mamba_num_heads=4,
                       mamba_head_dim=8, ssm_state_size=8, n_groups=1, chunk_size=8,
                       n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       moe_shared_expert_intermediate_size=16),
    "jamba": dict(_DENSE, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                  expert_layer_period=2, expert_layer_offset=1, num_experts=4,
                  num_experts_per_tok=2, mamba_d_state=8),
    "bamba": dict(_DENSE, num_hidden_layers=2, attn_layer_indices=[1], mamba_n_heads=4,
                  mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8),
    "granitemoehybrid": dict(_DENSE, num_hidden_layers=2, layer_types=["mamba", "attention"],
                             num_local_experts=4, num_experts_per_tok=2,
                             shared_intermediate_size=32, mamba_n_heads=4, mamba_d_head=16,
                             mamba_d_state=8, mamba_chunk_size=8),
    "zamba2": dict(_DENSE, num_key_value_heads=4, num_hidden_layers=4, mamba_d_state=8,
                   layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=4,
                   chunk_size=8),
    "mamba": dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8),
    "mamba2": dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8,
                   num_heads=4, head_dim=16, n_groups=1, chunk_size=8),
    "falcon_mamba": dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8),
}  # fmt: skip

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "nemotron_h_pattern_latent": ("nemotron_h", dict(
        CONFIGS["nemotron_h"], layers_block_type=None, hybrid_override_pattern="M*M-E",
        moe_latent_size=8)),
    "zamba2_adapters_rope": ("zamba2", dict(
        CONFIGS["zamba2"], num_hidden_layers=5, num_mem_blocks=2, use_mem_rope=True,
        use_shared_attention_adapter=True, adapter_rank=4,
        layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid"])),
    "granitemoehybrid_rope_dense": ("granitemoehybrid", dict(
        CONFIGS["granitemoehybrid"], num_hidden_layers=3, num_local_experts=0,
        position_embedding_type="rope", layer_types=["attention", "mamba", "mamba"])),
    "jamba_default_periods": ("jamba", dict(
        CONFIGS["jamba"], num_hidden_layers=9, attn_layer_period=8, attn_layer_offset=4)),
    "bamba_all_mamba": ("bamba", dict(CONFIGS["bamba"], attn_layer_indices=None)),
}  # fmt: skip

ARCHITECTURES = {
    "falcon_h1": "FalconH1ForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "jamba": "JambaForCausalLM",
    "bamba": "BambaForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "zamba2": "Zamba2ForCausalLM",
    "mamba": "MambaForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "falcon_mamba": "FalconMambaForCausalLM",
}


def config_json(model_type: str, **fields: Any) -> dict[str, Any]:
    """The family's tiny config as its config.json holds it (model_type, architectures)."""
    raw = {**CONFIGS[model_type], **fields}
    return {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type, **raw}


def all_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every tiny config, the families' and their variants: case -> (model_type, fields)."""
    return {**{name: (name, fields) for name, fields in CONFIGS.items()}, **VARIANTS}
