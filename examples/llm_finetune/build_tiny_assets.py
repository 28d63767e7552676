"""Build the local assets `tiny_llama_squad.yaml` reads, under .tuneyard/assets/.

A seeded tiny Llama with its BPE tokenizer, and a SQuAD-format train/validation set; all
made from nothing (no hub access). Run from the repository root:
    python3 examples/llm_finetune/build_tiny_assets.py
"""

from __future__ import annotations

from pathlib import Path

from cli.demo_assets import build_tiny_llama, write_squad_dir


def main(root: Path = Path(".tuneyard/assets")) -> None:
    build_tiny_llama(root / "tiny_llama")
    write_squad_dir(root / "squad", n=256)
    print(f"wrote {root / 'tiny_llama'} and {root / 'squad'}")


if __name__ == "__main__":
    main()
