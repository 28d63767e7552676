"""The demo's assets, built from nothing: a BPE tokenizer, a tiny Llama, learnable data.

`tuneyard demo` trains a model on this machine without touching a hub, and tests,
benchmarks and the example builders reuse the same pieces; the trainer never imports this
module. The tokenizer is a byte-level BPE trained in a fraction of a second on the generated
corpus; the model is a Llama-style config with seeded random weights saved as safetensors;
the data is an instruction task a small model visibly learns (reverse four spaced digits),
so the loss falls within a few dozen steps and held-out prompts come out right within a few
hundred. SQuAD-format files and `greedy_answers` (the demo's before/after table) sit beside
them. The torch stack is imported inside the functions that need it, so importing this
module stays cheap.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = [
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
]


DIGITS = 4  # per reversal task: short enough for a tiny model to master in minutes on CPU


def reversal_pair(digits: str) -> dict[str, str]:
    """`Reverse 3 8 1 5:` -> ` 5 1 8 3`: spaced digits, so every digit is its own token."""
    return {"prompt": f"Reverse {' '.join(digits)}:", "completion": " " + " ".join(digits[::-1])}


def instruction_pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    """n prompt/completion pairs: reverse a sequence of DIGITS digits."""
    rng = random.Random(seed)
    return [
        reversal_pair("".join(rng.choice("0123456789") for _ in range(DIGITS))) for _ in range(n)
    ]


def held_out_pairs(n: int, seen: list[dict[str, str]], seed: int = 1234) -> list[dict[str, str]]:
    """n reversal pairs none of which is in `seen`: what a demo asks after training."""
    known, rng, found = {p["prompt"] for p in seen}, random.Random(seed), []
    while len(found) < n:
        pair = reversal_pair("".join(rng.choice("0123456789") for _ in range(DIGITS)))
        if pair["prompt"] not in known:
            known.add(pair["prompt"])
            found.append(pair)
    return found


def greedy_answers(model_dir: Path, prompts: list[str], max_new_tokens: int = 12) -> list[str]:
    """What the model in `model_dir` (with its tokenizer) answers each prompt, greedily."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    answers = []
    for prompt in prompts:
        ids = [tokenizer.bos_token_id, *tokenizer(prompt)["input_ids"]]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        answers.append(tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip())
    return answers


def write_instruction_jsonl(path: Path, n: int = 256, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for pair in instruction_pairs(n, seed):
            f.write(json.dumps(pair) + "\n")
    return path


def write_squad_dir(directory: Path, n: int = 64, seed: int = 0) -> Path:
    """A SQuAD-format dataset dir with train.json and validation.json."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, count, offset in (("train", n, 0), ("validation", max(8, n // 8), 1000)):
        rng = random.Random(seed + offset)
        paragraphs = []
        for i in range(count):
            city = rng.choice(["Paris", "Lima", "Oslo", "Quito", "Accra", "Hanoi"])
            ctx = f"Item {i} was made in {city}."
            qa = {
                "id": f"{split}-{i}",
                "question": f"Where was item {i} made?",
                "answers": [{"text": city, "answer_start": ctx.index(city)}],
            }
            paragraphs.append({"context": ctx, "qas": [qa]})
        doc = {"version": "1.1", "data": [{"title": split, "paragraphs": paragraphs}]}
        (directory / f"{split}.json").write_text(json.dumps(doc))
    return directory


def build_tokenizer(directory: Path, vocab_size: int = 512, corpus: list[str] | None = None):
    """Train a byte-level BPE on the corpus and save it as a transformers tokenizer dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = corpus or [p["prompt"] + p["completion"] for p in instruction_pairs(2000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return fast


def tiny_llama_config(vocab_size: int = 512, **overrides):
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def build_tiny_llama(directory: Path, vocab_size: int = 512, seed: int = 0, **overrides) -> Path:
    """Save a seeded tiny Llama (safetensors + config.json) and a tokenizer in one dir."""
    import torch
    from transformers import LlamaForCausalLM

    build_tokenizer(directory, vocab_size=vocab_size)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size, **overrides))
    model.save_pretrained(directory, safe_serialization=True)
    return directory
