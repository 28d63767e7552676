"""The realistic maxima of every number that feeds a job's plan, in one place.

`jobs.recipe.load.bounds` keeps each value within what JSON and int64 can hold; these are
tighter: the largest value a fine-tuning job can mean, with room to spare above the
largest published model and recipe (AutoModel's recipes stay orders of magnitude below).
The schema (`jobs.recipe.load.schema`), the section checks (`jobs.recipe.sections`), the
topology rules (`jobs.recipe.topology`) and the request schema (`api.schemas`) enforce
them, each as a `FieldError` at its field naming the maximum. With every input within
them, the plan's products (tokens per step, FLOPs, memory per rank) stay finite and exact:
`MAX_PLAN_NUMBER` is what `jobs.recipe.plan` checks before a figure is stored. The model
config's sizes (`MAX_MODEL_SIZES`) bound what the estimate reads from a config.json or
its overrides; a config past them gets no estimate, as an unreadable one does.
"""

from __future__ import annotations

# Steps. A billion optimizer steps is three years at ten steps a second; every step count
# (max_steps, intervals, warm-up, a benchmark's steps, a checkpoint's step) is one.
MAX_STEPS = 10**9
MAX_EPOCHS = 10**6  # passes over the data; a tiny set repeated for a long run needs thousands

# Batches, in samples. The largest published global batches are a few thousand sequences
# (4M tokens); 2**24 leaves a factor of a thousand. A rank's micro-batch of 2**16 samples
# is already 2**24 tokens at 256 tokens each.
MAX_GLOBAL_BATCH = 2**24
MAX_LOCAL_BATCH = 2**16
MAX_GRAD_ACCUMULATION = MAX_GLOBAL_BATCH  # global = local x dp x accumulation

# Tokens. Published long-context fine-tunes reach 2**20 tokens per sequence; 2**22 (4M) is
# the longest sequence (and pack) accepted. One rank's micro-batch (local batch x sequence
# length) holds at most 2**24 tokens: four of the longest sequences, and what keeps the
# activation estimate of the largest models within exact integers.
MAX_SEQ_LENGTH = 2**22
MAX_MICRO_BATCH_TOKENS = 2**24

# Data: samples in a dataset (a trillion: past every public corpus in documents or rows)
# and the vocabulary of a mock dataset or a model (the largest published is 262144).
MAX_DATASET_SAMPLES = 2**40
MAX_VOCAB_SIZE = 2**22
MAX_DATALOADER_WORKERS = 256  # worker processes per rank: one per core of a large node

# Ranks. Every parallel size and the world size (nnodes x nproc_per_node) at most 2**16;
# the request schema accepts 256 nodes of 64 processes (2**14 ranks).
MAX_PARALLEL_SIZE = 2**16
MAX_WORLD_SIZE = 2**16
MAX_NNODES = 256
MAX_NPROC_PER_NODE = 64

# PEFT: a LoRA rank past 2**14 is wider than most models' hidden size; alpha scales it.
MAX_LORA_RANK = 2**14
MAX_LORA_ALPHA = 2.0**16

# Others: a process-group timeout of a week (torch's timedelta overflows far beyond);
# a device's peak (dense FP4 of the fastest parts is about 10**4 TFLOP/s); DDP's gradient
# bucket (1 TiB); a quantization group (a row of the widest weight).
MAX_TIMEOUT_MINUTES = 7 * 24 * 60
MAX_PEAK_TFLOPS = 1e5
MAX_BUCKET_CAP_MB = 2.0**20
MAX_QUANT_GROUP_SIZE = 2**20

# A model config's sizes, as the estimate reads them (the largest published decoders:
# hidden 16384-25600, 126-160 layers, 128 heads, head_dim 256, a 53248-wide MLP, a
# 262144-token vocabulary), each with a factor of eight or more to spare, and the parameter
# count, which also bounds the sizes read without a maximum of their own (experts, latent
# ranks): 2**45, about 35T, where the largest published is about 2T. A token's matmuls
# pass through at most as many parameters.
MAX_MODEL_SIZES = {
    "hidden_size": 2**17,
    "num_hidden_layers": 2**12,
    "num_attention_heads": 2**12,
    "num_key_value_heads": 2**12,
    "head_dim": 2**12,
    "intermediate_size": 2**20,
    "vocab_size": MAX_VOCAB_SIZE,
}
MAX_PARAM_COUNT = 2**45

# What the plan stores: integers exact in a float64 (and in JavaScript), far inside int64,
# and finite floats below this. With the maxima above, a realistic job's figures are far
# below it; a figure past it is not an estimate of anything that runs.
MAX_PLAN_NUMBER = 2**53


def at_most(limit: int | float) -> str:
    """The maximum as a user reads it: `4194304 (2**22)` for a power of two."""
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)
    if isinstance(limit, int) and limit > 1024 and limit & (limit - 1) == 0:
        return f"{limit} (2**{limit.bit_length() - 1})"
    return str(limit)
