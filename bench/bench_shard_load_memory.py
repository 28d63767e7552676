"""Per-rank peak RSS of an FSDP2 from_pretrained load: full load vs shard-only load.

Builds a ~60M-parameter Llama and a tiny one (fp32 safetensors), then for each path and
model launches a fresh 2-rank gloo `torchrun` whose ranks record `ru_maxrss` before and
after the load (full: `from_pretrained` on every rank, then `fully_shard`; shard-only:
meta build, `fully_shard`, `fill_sharded`). The tiny model's growth is subtracted (it is
the fixed cost of the path's code), and the rest is printed as a multiple of the big
model's fp32 bytes, both paths side by side; the highest rank counts.

    python3 bench/bench_shard_load_memory.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIG = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    tie_word_embeddings=False,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)


def _save(directory: Path, shape: dict) -> int:
    import torch
    import transformers

    from models.auto import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(transformers.LlamaConfig(**shape))
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters()) * 4


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(directory: Path, path: str, out: Path) -> None:
    """One rank: load `directory` on `path` ('full' or 'shard'); write its RSS growth."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from models.auto import AutoModelForCausalLM
    from models.common import shard_load
    from models.hooks import decoder_layers

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dist.barrier()
    before = _rss_kib()
    if path == "full":
        model = AutoModelForCausalLM.from_pretrained(directory)
    else:
        model, _ = shard_load.build_meta_native(directory)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if path == "shard":
        shard_load.fill_sharded(model, directory, torch.device("cpu"))
    dist.barrier()
    growth = (_rss_kib() - before) * 1024
    (out / f"{path}-{dist.get_rank()}.json").write_text(json.dumps(growth))
    dist.destroy_process_group()


def _launch(directory: Path, path: str, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        __file__,
        "--worker",
        str(directory),
        path,
        str(out),
    ]
    subprocess.run(command, check=True, env=env, cwd=REPO, capture_output=True)
    return max(json.loads(p.read_text()) for p in out.glob(f"{path}-*.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-shard-load-"))
    model_bytes = _save(root / "big", BIG)
    _save(root / "tiny", TINY)
    print(f"Llama {model_bytes / 4 / 1e6:.1f}M params, fp32 {model_bytes / 2**20:.0f} MiB, 2 ranks")
    print(f"{'path':<12}{'big MiB':>10}{'tiny MiB':>10}{'x model':>10}")
    for path in ("full", "shard"):
        big = _launch(root / "big", path, root / f"out-big-{path}")
        tiny = _launch(root / "tiny", path, root / f"out-tiny-{path}")
        ratio = (big - tiny) / model_bytes
        print(f"{path:<12}{big / 2**20:>10.0f}{tiny / 2**20:>10.0f}{ratio:>10.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.insert(0, str(REPO))
        worker(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    else:
        sys.path.insert(0, str(REPO))
        main()
