"""Native vs transformers `from_pretrained` for a mid-size model of one family: time, peak RSS.

`--family` picks a row of `FAMILIES` (a transformers config class and its kwargs, ~100-300M
parameters); the parent builds that model once with seeded random weights and saves it to a
temp dir in `--dtype`, then each load runs in its own fresh child process, alternating
native and transformers for `--repeats` rounds, so peaks never mix. In a child, imports and
config parsing come first, the kernel's peak-RSS counter is reset (/proc/self/clear_refs),
then `models.AutoModelForCausalLM.from_pretrained` (native) or
`transformers.AutoModelForCausalLM.from_pretrained` loads the directory and one short
forward runs. Printed: median load seconds and peak RSS growth (MiB, after load and after
the forward) per loader, and native/transformers ratios.

    python bench/bench_family_load.py --family mistral [--dtype bfloat16] [--repeats 3]

Other families add one entry to `FAMILIES` (config class name in `transformers`, kwargs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_VOCAB = dict(vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)

FAMILIES: dict[str, tuple[str, dict]] = {}

# ~125M parameters: 12 layers of 768, GQA 12/4 heads, a 4096-token sliding window.
FAMILIES["mistral"] = (
    "MistralConfig",
    dict(
        _VOCAB,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        sliding_window=4096,
    ),
)

# ~135M parameters: 8 layers of 512, 8 experts of width 1024, top-2 routing.
FAMILIES["mixtral"] = (
    "MixtralConfig",
    dict(
        _VOCAB,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=2,
    ),
)

# ~125M parameters: 12 layers of 768, GQA 12/4 heads, fused qkv/gate_up in the checkpoint
# (split on load), partial rotary 0.75 with LongRoPE (original 1024 of 4096), window 2047.
FAMILIES["phi3"] = (
    "Phi3Config",
    dict(
        _VOCAB,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        sliding_window=2047,
        partial_rotary_factor=0.75,
        original_max_position_embeddings=1024,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.01 * i for i in range(24)],
            "long_factor": [1.0 + 0.2 * i for i in range(24)],
        },
    ),
)


# ~135M parameters: 8 layers of 512 (sliding 128 / full alternating), 8 biased experts of
# width 1024, top-2 routing, attention sinks, YaRN (factor 32 over 128 positions).
FAMILIES["gpt_oss"] = (
    "GptOssConfig",
    dict(
        _VOCAB,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=128,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 128,
        },
    ),
)

# ~128M parameters: 12 layers of 768 (sliding 512 / full alternating), GQA 12/4 heads of 64,
# GeGLU width 3072, sandwich norms, attention and final logit soft-caps 50 / 30; tied.
FAMILIES["gemma2"] = (
    "Gemma2Config",
    dict(
        _VOCAB,
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=512,
        tie_word_embeddings=True,
    ),
)

# ~128M parameters: Gemma 2's shape with q/k norms, 5 local (window 512, base 10k) per
# global layer (base 1M, linear x8), no attention soft-cap; tied.
FAMILIES["gemma3"] = (
    "Gemma3TextConfig",
    dict(
        _VOCAB,
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=512,
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
    ),
)

# ~130M parameters: 8 layers of 512 (layer 0 dense), latent attention (q rank 192, kv rank
# 128, nope/rope/v 64/32/64), 16 routed experts of width 512 in 4 groups (top-4 of the 2 best
# groups) plus one shared expert, YaRN with the mscale softmax correction.
FAMILIES["deepseek_v3"] = (
    "DeepseekV3Config",
    dict(
        _VOCAB,
        hidden_size=512,
        intermediate_size=1536,
        moe_intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=192,
        kv_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        n_routed_experts=16,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
        first_k_dense_replace=1,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 1024,
        },
    ),
)


def _rss_fields() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process, in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def save_checkpoint(family: str, dtype: str, directory: Path) -> int:
    """Build the family's model with seeded weights, save it in `dtype`; returns #params."""
    import torch
    import transformers

    class_name, kwargs = FAMILIES[family]
    config = getattr(transformers, class_name)(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def measure_one(loader: str, directory: Path, dtype: str) -> dict:
    """One load in this (fresh) process: seconds and peak RSS growth."""
    import torch
    import transformers

    from models import AutoModelForCausalLM

    transformers.AutoConfig.from_pretrained(directory)  # config parsing outside the clock
    Path("/proc/self/clear_refs").write_text("5")
    base = _rss_fields()["VmRSS"]
    start = time.perf_counter()
    if loader == "native":
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        assert model.tuneyard_backend == "native", "the native class did not load"
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=getattr(torch, dtype), local_files_only=True
        )
    load_s = time.perf_counter() - start
    peak_load = _rss_fields()["VmHWM"] - base
    with torch.no_grad():
        model(input_ids=torch.arange(1, 33).unsqueeze(0))
    return {
        "load_s": load_s,
        "peak_load_mib": peak_load / 2**20,
        "peak_forward_mib": (_rss_fields()["VmHWM"] - base) / 2**20,
    }


def run_child(loader: str, directory: Path, dtype: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    command = [sys.executable, __file__, "--one", loader, "--dir", str(directory)]
    out = subprocess.run(
        [*command, "--dtype", dtype], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(family: str, dtype: str, params: int, size: int, runs: dict[str, list[dict]]) -> None:
    repeats = len(runs["native"])
    print(
        f"{family}: {params / 1e6:.0f}M parameters, {dtype}, checkpoint {size / 2**20:.0f} MiB, "
        f"median of {repeats} fresh processes per loader"
    )
    print(f"{'metric':18s} {'native':>10s} {'transformers':>13s} {'native/hf':>10s}")
    for key in ("load_s", "peak_load_mib", "peak_forward_mib"):
        native = statistics.median(r[key] for r in runs["native"])
        hf = statistics.median(r[key] for r in runs["hf"])
        ratio = native / hf if hf else float("inf")
        print(f"{key:18s} {native:10.3f} {hf:13.3f} {ratio:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="mistral")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=["native", "hf"], help="child: one measurement")
    parser.add_argument("--dir", type=Path, help="child: the saved checkpoint")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.dir, args.dtype)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        params = save_checkpoint(args.family, args.dtype, directory)
        size = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
        runs: dict[str, list[dict]] = {"native": [], "hf": []}
        for _ in range(args.repeats):
            for loader in runs:
                runs[loader].append(run_child(loader, directory, args.dtype))
    report(args.family, args.dtype, params, size, runs)


if __name__ == "__main__":
    main()
