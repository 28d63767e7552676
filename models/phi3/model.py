"""Native `Phi3ForCausalLM`: the shared decoder stack with Phi-3's rotary and fused weights.

The math is Llama's (grouped-query attention without biases, SwiGLU, RMSNorm) with Phi-3's
rotary (`models.phi3.rope`: partial rotary, LongRoPE short/long factors) and the common
sliding-window mask when `sliding_window` is set (every layer windowed, as transformers
does). Hugging Face checkpoints fuse q/k/v and gate/up; native keeps them separate (so the
common dense tensor-parallel plan applies) and `Phi3StateDictAdapter` splits them on load
and fuses them on save, reading and writing one tensor at a time. Residual dropout
(`resid_pdrop`) wraps each block's output (`models.phi3.layers`); `embd_pdrop` is unused,
as in transformers. Nothing is fp32-sensitive (no router, sink or per-head scale), so
`_keep_in_fp32_modules_strict` stays empty. Tied embeddings: both (Phi-3-mini/medium
untied, Phi-4-mini tied).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.safetensors_io import SafetensorsReader
from models.common.safetensors_io.shards import plan_shards, shard_file_names, write_index
from models.common.safetensors_io.writer import write_file
from models.common.tie import reject_unsupported_tie_word_embeddings
from models.phi3.layers import Phi3Attention, phi3_mlp
from models.phi3.rope import Phi3RotaryEmbedding, phi3_rope_unsupported_reason


class Phi3ForCausalLM(NativeCausalLM):
    architecture = "Phi3ForCausalLM"
    # LoRA adapters export fused for transformers' Phi-3 (state_dict_adapter.fuse_lora_adapter).

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        backbone = DecoderModel(config, mlp_factory=phi3_mlp)
        backbone.rotary_emb = Phi3RotaryEmbedding(config)
        for layer in backbone.layers:  # the common attention plus Phi-3's residual dropout
            layer.self_attn = Phi3Attention(config)
        super().__init__(config, backbone)

    @classmethod
    def rope_unsupported_reason(cls, config: Any) -> str | None:
        """Phi-3's rotary (partial, LongRoPE) instead of the common one."""
        return phi3_rope_unsupported_reason(config)

    def load_hf_weights(self, directory: Path) -> None:
        """Read every tensor, and each fused tensor's row ranges, straight into parameters."""
        params = dict(self.named_parameters())
        adapter = self.state_dict_adapter()
        with SafetensorsReader(directory) as reader:
            expected = dict.fromkeys(adapter.hf_names(params))
            self.check_checkpoint_keys(expected, set(reader.specs), directory)
            reader.read_many(adapter.read_plan(params, self.config, reader.specs))
        self.tie_weights()

    def hf_state_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face key, tensor) pairs; each fused tensor is built only when reached."""
        yield from self.state_dict_adapter().iter_hf(dict(self.named_parameters()), self.config)

    def save_weights(self, directory: Path, max_shard_size: int) -> None:
        """Safetensors shards whose fused tensors are built one at a time as written."""
        params = dict(self.named_parameters())
        shards = plan_shards(
            self.state_dict_adapter().hf_entries(params, self.config), max_shard_size
        )
        items = self.hf_state_items()
        for name, shard in zip(shard_file_names(len(shards)), shards, strict=True):
            write_file(directory / name, shard, (next(items) for _ in shard))
        write_index(directory, shards)


ModelClass = Phi3ForCausalLM
