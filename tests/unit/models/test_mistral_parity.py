"""Native Mistral against transformers in fp32: sliding-window masks, layers, logits, loss.

The checks cross the window (sequences longer than `sliding_window`), with padding and with
packed rows, and also cover Qwen2/Qwen3 configs whose upper layers use sliding windows
(`use_sliding_window`), which the common stack now runs natively. Each windowed check also
asserts that the window changes the result, so a mask that ignored it would fail.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_checks import (
    assert_logits_and_loss_match,
    assert_padded_logits_match,
    assert_save_round_trips_and_reloads,
    train_losses,
)
from mistral_family_configs import VOCAB, mistral_config
from transformers.masking_utils import create_sliding_window_causal_mask

from models import AutoModelForCausalLM
from models.common.layers import DecoderLayer, build_attention_mask
from models.mistral.model import MistralForCausalLM

ATOL = 1e-5


def _pair(config):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    native = AutoModelForCausalLM.from_config(config).eval()
    assert native.tuneyard_backend == "native"
    native.load_state_dict(hf.state_dict(), strict=True)
    return hf, native


def _ids(batch: int = 2, seq: int = 20) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(1, VOCAB, (batch, seq))


def _brute_force_window(seq: int, window: int) -> torch.Tensor:
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    return (j <= i) & (j > i - window)


def test_window_mask_semantics_and_fast_path():
    cpu = torch.device("cpu")
    assert build_attention_mask(None, None, 2, 6, cpu, sliding_window=6) is None
    assert build_attention_mask(None, None, 2, 5, cpu, sliding_window=None) is None
    mask = build_attention_mask(None, None, 2, 9, cpu, sliding_window=4)
    assert mask.shape == (1, 1, 9, 9)  # a window alone broadcasts over the batch
    assert torch.equal(mask[0, 0], _brute_force_window(9, 4))
    assert int(mask[0, 0].sum(-1).max()) == 4  # each query sees exactly w keys once past w


def test_window_mask_equals_transformers_mask():
    config = mistral_config(sliding_window=5)
    embeds = torch.zeros(2, 13, 64)
    pad = torch.ones(2, 13, dtype=torch.long)
    pad[1, :4] = 0
    for attention_mask in (None, pad):
        ref = create_sliding_window_causal_mask(
            config=config, inputs_embeds=embeds, attention_mask=attention_mask, cache=None,
            position_ids=torch.arange(13).unsqueeze(0), allow_is_causal_skip=False,
        )  # fmt: skip
        ours = build_attention_mask(attention_mask, None, 2, 13, embeds.device, sliding_window=5)
        rows = slice(None) if attention_mask is None else attention_mask.bool()
        assert torch.equal(ours.expand(2, 1, 13, 13)[:, 0][rows], ref[:, 0][rows])


def test_decoder_layer_matches_with_window():
    hf, native = _pair(mistral_config())
    layer, ref_layer = native.model.layers[0], hf.model.layers[0]
    assert isinstance(layer, DecoderLayer) and layer.sliding_window == 6
    hidden = torch.randn(2, 16, 64)
    cos_sin = hf.model.rotary_emb(hidden, torch.arange(16).unsqueeze(0))
    ref_mask = create_sliding_window_causal_mask(
        config=hf.config, inputs_embeds=hidden, attention_mask=None, cache=None,
        position_ids=torch.arange(16).unsqueeze(0),
    )  # fmt: skip
    ours_mask = build_attention_mask(None, None, 2, 16, hidden.device, sliding_window=6)
    ref = ref_layer(hidden, attention_mask=ref_mask, position_embeddings=cos_sin)
    ours = layer(hidden, position_embeddings=cos_sin, attention_mask=ours_mask)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    full = layer(hidden, position_embeddings=cos_sin, attention_mask=None)
    assert (full - ref).abs().max() > 1e-3  # the window matters at this length


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("window", [6, None])
def test_logits_and_loss_match(tied, window):
    hf, native = _pair(mistral_config(sliding_window=window, tie_word_embeddings=tied))
    assert_logits_and_loss_match(hf, native, _ids(), masked=3, atol=ATOL)


def test_padded_logits_match_across_the_window():
    hf, native = _pair(mistral_config())
    assert_padded_logits_match(hf, native, _ids(), atol=ATOL)


def test_packed_rows_window_within_each_sample():
    hf, native = _pair(mistral_config())
    ids = _ids(1, 24)
    positions = torch.cat([torch.arange(10), torch.arange(14)]).unsqueeze(0)
    packed = native(input_ids=ids, position_ids=positions).logits
    separate = torch.cat([hf(input_ids=ids[:, :10]).logits, hf(input_ids=ids[:, 10:]).logits], 1)
    torch.testing.assert_close(packed, separate, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_sliding_window_layers_run_natively(family):
    config_class = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    config = config_class(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, use_sliding_window=True,
        sliding_window=5, max_window_layers=1, max_position_embeddings=128,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    hf, native = _pair(config)
    assert [layer.sliding_window for layer in native.model.layers] == [None, 5, 5]
    ids = _ids(2, 17)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    ref, out = hf(input_ids=ids, attention_mask=mask), native(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(out.logits[mask.bool()], ref.logits[mask.bool()], atol=ATOL, rtol=0)
    for layer in native.model.layers:
        layer.sliding_window = None
    assert (native(input_ids=ids).logits - hf(input_ids=ids).logits).abs().max() > 1e-3


def test_qwen3_moe_sliding_window_covers_every_layer():
    from tiny_model_configs import hf_to_native_state, make_config

    config = make_config("qwen3_moe", use_sliding_window=True, sliding_window=5)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    native = AutoModelForCausalLM.from_config(config).eval()
    native.load_state_dict(hf_to_native_state(hf.state_dict()), strict=True)
    assert [layer.sliding_window for layer in native.model.layers] == [5, 5]
    ids = _ids(2, 14)
    torch.testing.assert_close(native(input_ids=ids).logits, hf(input_ids=ids).logits,
                               atol=ATOL, rtol=0)  # fmt: skip


def test_bf16_logits_stay_close():
    hf, native = _pair(mistral_config())
    hf, native = hf.to(torch.bfloat16), native.to(torch.bfloat16)
    ids = _ids()
    ref, out = hf(input_ids=ids).logits.float(), native(input_ids=ids).logits.float()
    assert out.dtype == torch.float32 and (out - ref).abs().max() < 5e-2


def test_checkpoint_round_trip_and_transformers_reload(tmp_path):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(mistral_config()).save_pretrained(tmp_path / "hf")
    assert_save_round_trips_and_reloads(
        tmp_path / "hf", tmp_path / "native", MistralForCausalLM, _ids(), ATOL
    )


def test_training_lowers_the_loss():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(mistral_config()).train()
    losses = train_losses(model, _ids(4, 24))
    assert losses[-1] < losses[0] - 0.5, losses


def test_pipeline_stages_keep_each_layers_window():
    from models.common.pipeline_split import split_model, stage_layer_ranges

    def build():
        torch.manual_seed(0)
        config = transformers.Qwen2Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
            sliding_window=5, max_window_layers=2, max_position_embeddings=128,
        )  # fmt: skip
        return AutoModelForCausalLM.from_config(config).eval()

    ids = _ids(2, 14)
    want = build()(input_ids=ids).logits
    _, stages = split_model(build(), [0, 1], stage_layer_ranges(4, 2))
    assert [layer.sliding_window for layer in stages[1].layers] == [5, 5]
    torch.testing.assert_close(stages[1](stages[0](ids)), want, rtol=0, atol=0)
