"""Native Llama training step vs transformers' `LlamaForCausalLM`, side by side in one process.

Same config, seeded weights (native loads the HF state dict), batch, dtype and optimizer
(AdamW); steps alternate between the two models so machine noise hits both alike. Reports
the median step time per model and the ratio HF/native (>1 means native is faster), eager
and, with --compile, under `torch.compile` (compile time excluded: warm-up steps). Both
wall-clock and process CPU time are reported: on a shared machine the CPU-time ratio is the
steadier measure of the work each step does. `--control` adds an A/A row (transformers in
both slots) that shows how much the slot itself skews the wall-clock ratio on this host.

    OMP_NUM_THREADS=2 python bench/bench_native_llama.py [--steps 20] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_pair(args: argparse.Namespace, control: bool = False):
    import transformers

    from models import AutoModelForCausalLM

    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads // 2,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    native = AutoModelForCausalLM.from_config(config, dtype=args.dtype, force_hf=control)
    native.load_state_dict(hf.state_dict())
    assert native.tuneyard_backend == ("hf" if control else "native")
    return hf.train(), native.train()


def make_step(model: torch.nn.Module, compile_model: bool):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if compile_model else model

    def step(ids: torch.Tensor) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - wall, time.process_time() - cpu

    return step


def measure(
    args: argparse.Namespace, compile_model: bool, control: bool = False
) -> dict[str, tuple[float, float]]:
    """Median (wall, process CPU) seconds per step for each model."""
    hf, native = build_pair(args, control)
    steps = {"native": make_step(native, compile_model), "hf": make_step(hf, compile_model)}
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for i in range(args.warmup + args.steps):
        order = list(steps.items()) if i % 2 == 0 else list(steps.items())[::-1]
        for name, step in order:  # alternate who goes first: no position bias
            elapsed = step(ids)
            if i >= args.warmup:
                times[name].append(elapsed)
    return {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile")
    parser.add_argument(
        "--control",
        action="store_true",
        help="also time HF against HF in the native slot: the harness's own bias (A/A)",
    )
    args = parser.parse_args()
    print(
        f"Llama h={args.hidden} L={args.layers} heads={args.heads} vocab={args.vocab} "
        f"batch={args.batch}x{args.seq} {args.dtype}, threads={torch.get_num_threads()}, "
        f"median of {args.steps} alternating steps"
    )
    print(f"{'mode':8s} {'clock':5s} {'native s/step':>14s} {'hf s/step':>10s} {'hf/native':>10s}")
    modes = [("eager", False, False)] + ([("compile", True, False)] if args.compile else [])
    if args.control:
        modes.append(("control", False, True))
    for mode, compile_model, control in modes:
        med = measure(args, compile_model, control)
        for i, clock in enumerate(("wall", "cpu")):
            native, hf = med["native"][i], med["hf"][i]
            print(f"{mode:8s} {clock:5s} {native:14.4f} {hf:10.4f} {hf / native:10.3f}")


if __name__ == "__main__":
    main()
