"""Load SmolLM2-135M natively vs `transformers.from_pretrained`: time and peak resident memory.

Each measurement runs in a fresh child process (so peaks do not mix): imports and config
parsing happen first, the kernel's peak-RSS counter is reset (/proc/self/clear_refs), then
the model loads (fp32, the checkpoint's dtype) and one forward pass runs on a short prompt.
Reported per loader (median of --repeats children, alternating): load seconds, peak RSS
growth over the checkpoint's size right after loading and after the first forward (transformers
maps the file lazily, so its pages become resident only when used), and native/HF ratios.

    python bench/bench_load_smollm2.py [--repeats 3]
    python bench/bench_load_smollm2.py --one native   # one child measurement, JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_one(loader: str, dtype: str = "float32") -> dict:
    import torch
    import transformers
    import transformers.models.llama.modeling_llama  # noqa: F401 - import cost excluded

    from models import AutoModelForCausalLM
    from models.smollm2 import ensure_smollm2_checkpoint

    directory = ensure_smollm2_checkpoint()
    transformers.AutoConfig.from_pretrained(directory)
    size = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    Path("/proc/self/clear_refs").write_text("5")
    base = _status("VmRSS")
    start = time.perf_counter()
    if loader == "native":
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=getattr(torch, dtype), local_files_only=True
        )
    load_s = time.perf_counter() - start
    peak_load = _status("VmHWM") - base
    with torch.no_grad():
        model(input_ids=torch.arange(1, 17).unsqueeze(0))
    return {
        "loader": loader,
        "load_s": load_s,
        "size_bytes": size,
        "peak_after_load_x": peak_load / size,
        "peak_after_forward_x": (_status("VmHWM") - base) / size,
        "first_forward_total_s": time.perf_counter() - start,
    }


def run_child(loader: str, dtype: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    out = subprocess.run(
        [sys.executable, __file__, "--one", loader, "--dtype", dtype],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", choices=["native", "hf"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.dtype)))
        return
    runs: dict[str, list[dict]] = {"native": [], "hf": []}
    for _ in range(args.repeats):
        for loader in runs:
            runs[loader].append(run_child(loader, args.dtype))
    keys = ("load_s", "first_forward_total_s", "peak_after_load_x", "peak_after_forward_x")
    med = {
        k: {loader: statistics.median(r[k] for r in rs) for loader, rs in runs.items()}
        for k in keys
    }
    size = runs["native"][0]["size_bytes"] / 2**20
    print(
        f"SmolLM2-135M-Instruct, {args.dtype}, checkpoint {size:.0f} MiB, "
        f"median of {args.repeats} fresh processes each"
    )
    print(f"{'metric':28s} {'native':>10s} {'transformers':>13s} {'native/hf':>10s}")
    for k in keys:
        n, h = med[k]["native"], med[k]["hf"]
        print(f"{k:28s} {n:10.3f} {h:13.3f} {n / h if h else float('inf'):10.2f}")


if __name__ == "__main__":
    main()
