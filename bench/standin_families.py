"""Tiny models of AutoModel's hub families, and tiny hub datasets, for the stand-in runner.

`bench/automodel_standins.py` serves, under the very hub names a recipe uses, a repository
whose config.json has the real model's `model_type` and architecture with tiny sizes (hidden
64, 4 layers, 4 heads, 2 kv heads, vocab 1024, 4 experts) and the fields that make the family
what it is (Gemma's `layer_types` and soft-caps, Falcon-H1's Mamba mixers, Nemotron-H's
`hybrid_override_pattern`, DeepSeek's latent attention and grouped router, Llama 3's RoPE
scaling, tied or untied embeddings as the real checkpoint has them), random weights saved
by transformers as safetensors, and one BPE tokenizer trained on the stand-in datasets.
`FAMILIES` maps hub names to those configs; a name it does not match has no stand-in (a
family whose modeling code lives only in its repository, or one this table does not know).
`DATASETS` builds the hub datasets the recipes name (SQuAD, HellaSwag, natural-instructions,
Tulu 3) as parquet repositories in their real column layout, so each dataset class reads
the same name and keywords it reads in the real recipe.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# 1024: MockIterableDataset draws token ids below its default vocab_size of 1024
VOCAB = 1024
EXPERTS = 4  # divisible by every stand-in ep_size (2 or 4)
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,  # an interleaved pipeline of 2 ranks needs 4 stages
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
WINDOW = 32  # below the stand-in sequence length, so sliding windows bind
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 128,  # below max_position_embeddings, as in the real one
}
ALTERNATE = ["sliding_attention", "full_attention"] * 2
LOCAL_GLOBAL = ["sliding_attention"] * 3 + ["full_attention"]
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
LATENT = {  # DeepSeek-style multi-head latent attention, at tiny ranks
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "head_dim": 8,  # the rotary part, as DeepSeek's config derives it
    "num_key_value_heads": 4,
}
MAMBA2 = {"mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 1}
TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "head_dim": 16,
    "image_size": 32,
    "patch_size": 16,
}

# (hub-name pattern, model_type, the family's own fields at tiny sizes): first match wins.
FAMILIES: list[tuple[str, str, dict[str, Any]]] = [
    (
        r"meta-llama/Llama-3\.2-",
        "llama",
        {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": True},
    ),
    (
        r"meta-llama/Llama-3\.[13]-|nvidia/Llama-3\.1-Nemotron-Nano",
        "llama",
        {"rope_parameters": LLAMA3_ROPE},
    ),
    (
        r"tiiuae/Falcon3-|ByteDance-Seed/Seed-Coder",
        "llama",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1000042.0}},
    ),
    (r"Qwen/Qwen2\.5-0\.5B", "qwen2", {"tie_word_embeddings": True}),
    (r"Qwen/Qwen2\.5-|Qwen/QwQ-", "qwen2", {}),
    (r"Qwen/Qwen3-0\.6B", "qwen3", {"tie_word_embeddings": True}),
    (
        r"Qwen/Qwen3-Next-",
        "qwen3_next",
        {
            **MOE,
            "num_experts": EXPERTS,
            "shared_expert_intermediate_size": 32,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
    ),
    (
        r"Qwen/Qwen3-\d+B-A\d+B",
        "qwen3_moe",
        {**MOE, "num_experts": EXPERTS, "norm_topk_prob": True},
    ),
    (r"Qwen/Qwen3-", "qwen3", {}),
    (
        r"Qwen/Qwen1\.5-MoE-",
        "qwen2_moe",
        {**MOE, "num_experts": EXPERTS, "shared_expert_intermediate_size": 32},
    ),
    (
        r"google/gemma-2-",
        "gemma2",
        {
            "layer_types": ALTERNATE,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
        },
    ),
    (
        r"google/gemma-3-",
        "gemma3_text",
        {
            "layer_types": LOCAL_GLOBAL,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 16,
            "tie_word_embeddings": True,
        },
    ),
    (
        r"google/gemma-4-",
        "gemma4",
        {
            "text_config": {
                "model_type": "gemma4_text",
                "layer_types": LOCAL_GLOBAL,
                "sliding_window": WINDOW,
                "hidden_size_per_layer_input": 16,
                "vocab_size_per_layer_input": VOCAB,
            },
            "vision_config": {"model_type": "gemma4_vision", **TINY_VISION},
            "audio_config": None,
        },
    ),
    (r"google/gemma-", "gemma", {"tie_word_embeddings": True}),
    (
        r"mistralai/Mixtral-",
        "mixtral",
        {"num_local_experts": EXPERTS, "num_experts_per_tok": 2, "sliding_window": None},
    ),
    (r"mistralai/Mistral-Nemo-", "mistral", {"head_dim": 32, "sliding_window": None}),
    (r"mistralai/Mistral-7B-v0\.1", "mistral", {"sliding_window": WINDOW}),
    (
        r"mistralai/Ministral-3-|mistralai/Devstral-Small-2-",
        "mistral3",
        {
            "text_config": {"model_type": "ministral3", "sliding_window": None},
            "vision_config": {"model_type": "pixtral", **TINY_VISION},
            "spatial_merge_size": 1,
        },
    ),
    (
        r"mistralai/Mistral-Small-4-",
        "mistral3",
        {
            "text_config": {
                "model_type": "mistral4",
                **MOE,
                **LATENT,
                "head_dim": 24,
                "n_routed_experts": EXPERTS,
                "q_lora_rank": 32,
            },
            "vision_config": {"model_type": "pixtral", **TINY_VISION},
            "spatial_merge_size": 1,
        },
    ),
    (r"microsoft/phi-2", "phi", {"partial_rotary_factor": 0.4}),
    (r"microsoft/Phi-3-mini-", "phi3", {"sliding_window": WINDOW}),
    (r"microsoft/phi-4", "phi3", {"sliding_window": None}),
    (
        r"CohereForAI/c4ai-command-r7b",
        "cohere2",
        {
            "layer_types": LOCAL_GLOBAL,
            "sliding_window": WINDOW,
            "logit_scale": 0.25,
            "tie_word_embeddings": True,
        },
    ),
    (
        r"tiiuae/Falcon-H1-",
        "falcon_h1",
        {
            "mamba_d_ssm": 64,
            "mamba_n_heads": 4,
            "mamba_d_head": 16,
            "mamba_d_state": 16,
            "mamba_n_groups": 1,
            "mamba_chunk_size": 16,
            "tie_word_embeddings": False,
        },
    ),
    (
        r"ibm-granite/granite-3",
        "granite",
        {
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.0078125,
            "logits_scaling": 8.0,
            "tie_word_embeddings": True,
        },
    ),
    (r"zai-org/glm-4-9b-chat-hf", "glm", {"partial_rotary_factor": 0.5, "attention_bias": True}),
    (
        r"zai-org/GLM-4\.5",
        "glm4_moe",
        {
            **MOE,
            "n_routed_experts": EXPERTS,
            "first_k_dense_replace": 1,
            "partial_rotary_factor": 0.5,
        },
    ),
    (
        r"zai-org/GLM-4\.7-Flash",
        "glm4_moe_lite",
        {**MOE, **LATENT, "n_routed_experts": EXPERTS, "q_lora_rank": 32},
    ),
    (
        r"baidu/ERNIE-4\.5-\d+B-A\d+B",
        "ernie4_5_moe",
        {
            "moe_num_experts": EXPERTS,
            "moe_k": 2,
            "moe_intermediate_size": 32,
            "moe_num_shared_experts": 1,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": 3,
        },
    ),
    (r"baidu/ERNIE-4\.5-", "ernie4_5", {"tie_word_embeddings": True}),
    (r"bigcode/starcoder2-", "starcoder2", {"sliding_window": WINDOW}),
    (r"ByteDance-Seed/Seed-OSS-", "seed_oss", {"attention_bias": True}),
    (
        r"nvidia/NVIDIA-Nemotron-(Nano-9B-v2|3-Nano-4B)",
        "nemotron_h",
        {**MAMBA2, "hybrid_override_pattern": "M-M*"},
    ),
    (
        r"nvidia/NVIDIA-Nemotron-3",
        "nemotron_h",
        {
            **MAMBA2,
            **MOE,
            "hybrid_override_pattern": "ME*E",
            "n_routed_experts": EXPERTS,
            "moe_shared_expert_intermediate_size": 32,
        },
    ),
    (
        r"deepseek-ai/DeepSeek-V3",
        "deepseek_v3",
        {
            **MOE,
            **LATENT,
            "n_routed_experts": EXPERTS,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "beta_fast": 32,
                "beta_slow": 1,
            },
        },
    ),
    (
        r"moonshotai/Moonlight-",
        "deepseek_v3",
        {
            **MOE,
            **LATENT,
            "n_routed_experts": EXPERTS,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": None,
        },
    ),
    (
        r"openai/gpt-oss-",
        "gpt_oss",
        {
            "num_local_experts": EXPERTS,
            "num_experts_per_tok": 2,
            "layer_types": ALTERNATE,
            "sliding_window": WINDOW,
            "intermediate_size": 64,
        },
    ),
    (
        r"poolside/Laguna-",
        "laguna",
        {
            **MOE,
            "num_experts": EXPERTS,
            "shared_expert_intermediate_size": 32,
            "sliding_window": WINDOW,
            "layer_types": LOCAL_GLOBAL,
        },
    ),
]
# Config fields a hub repository spells differently from the class's saved form.
HUB_SPELLING = {"nemotron_h": ("layers_block_type", "hybrid_override_pattern")}


def family_of(name: str) -> tuple[str, dict[str, Any]] | None:
    """The (model_type, fields) of the first `FAMILIES` row matching hub name `name`."""
    for pattern, model_type, fields in FAMILIES:
        if re.match(pattern, name):
            return model_type, fields
    return None


def tiny_config(model_type: str, fields: dict[str, Any]) -> Any:
    """A transformers config of `model_type` at `TINY` sizes with the family's fields; a
    multimodal family gets them in its `text_config`, with a tiny `vision_config`."""
    from transformers import AutoConfig

    if "text_config" not in fields:
        return AutoConfig.for_model(model_type, **{**TINY, **fields})
    text = dict(fields["text_config"])
    text = AutoConfig.for_model(text.pop("model_type"), **{**TINY, **text}).to_dict()
    rest = {k: v for k, v in fields.items() if k != "text_config"}
    return AutoConfig.for_model(model_type, text_config=text, **rest)


def _model_class(config: Any) -> Any:
    import transformers

    if hasattr(config, "text_config") and hasattr(config, "vision_config"):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def build_model_repo(repo: Path, name: str, tokenizer_dir: Path) -> Path | None:
    """Write the tiny stand-in of hub model `name` to `repo` (None: no family matches)."""
    import shutil

    import torch

    family = family_of(name)
    if family is None:
        return None
    model_type, fields = family
    config = tiny_config(model_type, fields)
    torch.manual_seed(0)
    model = _model_class(config).from_config(config, dtype=torch.bfloat16)
    repo.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(repo, safe_serialization=True)
    _hub_spelling(repo / "config.json", model_type, fields)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, repo / item.name)
    return repo


def _hub_spelling(path: Path, model_type: str, fields: dict[str, Any]) -> None:
    """Rewrite fields the way the real hub config.json spells them."""
    if model_type not in HUB_SPELLING:
        return
    saved, hub = HUB_SPELLING[model_type]
    config = json.loads(path.read_text())
    config.pop(saved, None)
    config[hub] = fields[hub]
    path.write_text(json.dumps(config, indent=2))


# Stand-in datasets ---------------------------------------------------------------------------

CITIES = ["Paris", "Lima", "Oslo", "Quito", "Accra", "Hanoi", "Cairo", "Perth"]
TOOLS = ["hammer", "brush", "ladder", "kettle", "rope", "lamp"]


def _squad(split: str, n: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        city = rng.choice(CITIES)
        context = f"The {rng.choice(TOOLS)} number {i} was made in {city}."
        rows.append(
            {
                "id": f"{split}-{i}",
                "title": "Stand-in",
                "context": context,
                "question": f"Where was number {i} made?",
                "answers": {"text": [city], "answer_start": [context.index(city)]},
            }
        )
    return rows


def _hellaswag(split: str, n: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        tool, city = rng.choice(TOOLS), rng.choice(CITIES)
        endings = [f"goes to {c}." for c in rng.sample(CITIES, 4)]
        label = rng.randrange(4)
        endings[label] = f"takes the {tool} to {city}."
        rows.append(
            {
                "ind": i,
                "activity_label": "Travel",
                "ctx_a": f"A person holds a {tool}.",
                "ctx_b": "Then the person",
                "ctx": f"A person holds a {tool}. Then the person",
                "endings": endings,
                "source_id": f"standin~{i}",
                "split": split,
                "split_type": "indomain",
                "label": str(label),
            }
        )
    return rows


def _natural_instructions(split: str, n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "task_name": "task001_standin",
            "id": f"task001-{split}-{i}",
            "definition": "Name the city where the tool was made.",
            "inputs": f"The {rng.choice(TOOLS)} was made in {(city := rng.choice(CITIES))}.",
            "targets": city,
        }
        for i in range(n)
    ]


def _tulu3(split: str, n: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        city = rng.choice(CITIES)
        messages = [
            {"role": "user", "content": f"Where was the {rng.choice(TOOLS)} made? ({city})"},
            {"role": "assistant", "content": f"It was made in {city}."},
        ]
        rows.append({"id": f"tulu-{split}-{i}", "messages": messages, "source": "standin"})
    return rows


RowMaker = Callable[[str, int, random.Random], list[dict[str, Any]]]
# hub dataset name -> (config folder, splits, row maker), in the real repository's layout
DATASETS: dict[str, tuple[str, tuple[str, ...], RowMaker]] = {
    "rajpurkar/squad": ("plain_text", ("train", "validation"), _squad),
    "rowan/hellaswag": ("data", ("train", "validation"), _hellaswag),
    "Rowan/hellaswag": ("data", ("train", "validation"), _hellaswag),
    "Muennighoff/natural-instructions": ("data", ("train", "validation"), _natural_instructions),
    "allenai/tulu-3-sft-mixture": ("data", ("train",), _tulu3),
}


def dataset_files(name: str, rows_per_split: int = 96) -> dict[str, bytes]:
    """The files of stand-in dataset repo `name`: a README whose `configs` block maps each
    split to its parquet shard, as the hub's parquet repositories do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, splits, make_rows = DATASETS[name]
    files: dict[str, bytes] = {}
    for index, split in enumerate(splits):
        buffer = io.BytesIO()
        pq.write_table(
            pa.Table.from_pylist(make_rows(split, rows_per_split, random.Random(index))), buffer
        )
        files[f"{folder}/{split}-00000-of-00001.parquet"] = buffer.getvalue()
    data_files = "".join(f"  - split: {s}\n    path: {folder}/{s}-*\n" for s in splits)
    readme = f"---\nconfigs:\n- config_name: default\n  data_files:\n{data_files}---\n"
    files["README.md"] = readme.encode()
    return files


def tokenizer_corpus() -> list[str]:
    """Every text of the stand-in datasets: the BPE learns their words, so rows stay short."""
    texts = []
    for _, _, make_rows in DATASETS.values():
        for row in make_rows("train", 64, random.Random(0)):
            texts.append(json.dumps(row))
    return texts
