"""Honest MFU and measured memory: peaks from a table by device and dtype (null where
unknown, CPU included), LoRA counted from the adapters a model really has, and each rank's
peak memory as growth over the run's baseline."""

from __future__ import annotations

import torch
from torch import nn

from cli.demo_assets import tiny_llama_config
from jobs.recipe.plan.flops import model_flops_per_token
from trainer import metrics


def test_peak_table_by_device_name_and_dtype():
    assert metrics.peak_flops_for("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert metrics.peak_flops_for("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert metrics.peak_flops_for("NVIDIA H200", "float32") == 67e12
    assert metrics.peak_flops_for("Tesla V100-SXM2-16GB", "bfloat16") is None  # no bf16 units
    assert metrics.peak_flops_for("Some Future GPU", "bfloat16") is None
    assert ("A100", 312e12) in metrics.GPU_PEAK_FLOPS


def test_cpu_has_no_peak_so_mfu_is_null():
    assert metrics.device_peak_flops(torch.device("cpu"), torch.float32) is None
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_llama_config())
    meter = metrics.StepMeter(model, torch.device("cpu"), world_size=1)
    record = meter.train_record(1, 0, 2.0, 1.0, 1e-3, tokens=256, seq_len=64, start=0.0)
    assert record.mfu is None and record.tps > 0
    assert meter.flops_per_token(64) == model_flops_per_token(model.config, 64)


def test_a_known_peak_gives_flops_times_throughput_over_peak(monkeypatch):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_llama_config())
    monkeypatch.setattr(metrics, "device_peak_flops", lambda device, dtype: 1e9)
    meter = metrics.StepMeter(model, torch.device("cpu"), world_size=2)
    clock = iter([10.0])
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    record = meter.train_record(1, 0, 2.0, 1.0, 1e-3, tokens=1000, seq_len=64, start=9.0)
    assert record.mfu == model_flops_per_token(model.config, 64) * 1000.0 / 2e9


def test_lora_flops_use_the_adapters_the_model_has():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM(tiny_llama_config())
    config = base.config
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapters = metrics.lora_adapter_params(model)
    assert adapters == 2 * (4 * (64 + 64) + 4 * (64 + 32))  # 2 layers, q 64->64, v 64->32
    meter = metrics.StepMeter(model, torch.device("cpu"), world_size=1)
    full = model_flops_per_token(config, 64)
    assert meter.flops_per_token(64) == model_flops_per_token(config, 64, lora=adapters) < full
    assert metrics.lora_adapter_params(nn.Linear(2, 2)) is None


def test_compute_dtype_is_the_parameters_without_mixed_precision():
    assert metrics.compute_dtype(nn.Linear(2, 2).to(torch.bfloat16)) == torch.bfloat16


_PEAK_CHECK = """
import torch
from trainer import metrics
metrics.mark_memory_baseline()
before = metrics.peak_memory_bytes(torch.device("cpu"))
block = torch.ones(256 << 20, dtype=torch.uint8)  # 256 MiB, touched
grown = metrics.peak_memory_bytes(torch.device("cpu"))
assert grown - before >= 192 << 20, (before, grown)  # the import peak may absorb some
(ranked,) = metrics.rank_peak_memory(torch.device("cpu"))  # one rank: its own peak
assert grown <= ranked <= metrics.peak_memory_bytes(torch.device("cpu"))  # a high-water mark only rises
assert metrics.memory_gib(torch.device("cpu")) * 2**30 >= grown
"""


def test_peak_memory_is_growth_over_the_baseline():
    """In a fresh process: a peak is a high-water mark, so the suite's earlier tests would
    hide a growth inside this process."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PEAK_CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_cpu_peak_never_falls_when_the_kernels_reading_does(monkeypatch):
    """`VmHWM` can read lower than before (the kernel's mark lags the current set), as a
    2-rank run saw by 2 pages between its last record and `finished`; the peak keeps the
    highest reading, and a new baseline starts it over."""
    readings = iter([1000 + 300, 1000 + 500, 1000 + 492, 1000 + 700, 2000 + 100])
    monkeypatch.setattr(metrics, "_cpu_memory", dict(metrics._cpu_memory))  # restored after
    monkeypatch.setattr(metrics, "_rss_bytes", lambda: 1000)
    monkeypatch.setattr(metrics, "_peak_rss_bytes", lambda: next(readings))
    cpu = torch.device("cpu")
    metrics.mark_memory_baseline()
    assert [metrics.peak_memory_bytes(cpu) for _ in range(4)] == [300, 500, 500, 700]
    monkeypatch.setattr(metrics, "_rss_bytes", lambda: 2000)
    metrics.mark_memory_baseline()
    assert metrics.peak_memory_bytes(cpu) == 100


def test_compute_dtype_is_fsdp2s_mixed_precision_param_dtype(monkeypatch):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29743", "RANK": "0",
                       "WORLD_SIZE": "1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo")
    try:
        model = nn.Sequential(nn.Linear(4, 4))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)), mp_policy=policy)
        assert next(model.parameters()).dtype == torch.float32
        assert metrics.compute_dtype(model) == torch.bfloat16
    finally:
        dist.destroy_process_group()


def test_a_config_the_flop_counter_cannot_read_leaves_mfu_null_and_warns_once(monkeypatch):
    """A per-layer size the counter does not know (Gemma-4's per-layer head_dim raises on
    the global read) must not stop the run: mfu is null, one warning says why."""
    from transformers import LlamaForCausalLM

    class PerLayerHeadDim(type(tiny_llama_config())):
        @property
        def head_dim(self):
            raise ValueError("head_dim differs per layer; read layer_types[i]")

        @head_dim.setter
        def head_dim(self, value):
            pass

    model = LlamaForCausalLM(tiny_llama_config())
    model.config.__class__ = PerLayerHeadDim
    monkeypatch.setattr(metrics, "device_peak_flops", lambda device, dtype: 1e9)
    warnings: list[str] = []
    meter = metrics.StepMeter(model, torch.device("cpu"), world_size=1, warn=warnings.append)
    for step in (1, 2):
        record = meter.train_record(step, 0, 2.0, 1.0, 1e-3, tokens=256, seq_len=64, start=0.0)
        assert record.mfu is None and record.tps > 0
    assert len(warnings) == 1 and "ValueError: head_dim differs per layer" in warnings[0]
