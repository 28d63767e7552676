"""Tokenizing once: a dataset built the first time (tokenizes) vs again (reads the cache).

Writes a HellaSwag parquet file and a chat JSONL file of `--rows` rows each, builds each
dataset twice in fresh subprocesses sharing one `HF_DATASETS_CACHE` (as two runs of one job
on one machine would), and prints the build times side by side and their ratio (imports
excluded). The second build memory-maps the cached tokenized rows and reads no source row.
Run: `python bench/bench_tokenize_cache.py --rows 20000`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = """
import sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
from transformers import AutoTokenizer
import datasets  # imported before the clock starts: both builds pay it alike
from sft_fixtures import TOOL_TEMPLATE
from trainer.data.chat import ChatDataset
from trainer.data.hellaswag import HellaSwag
tok = AutoTokenizer.from_pretrained({tok!r})
start = time.perf_counter()
if {kind!r} == "hellaswag":
    ds = HellaSwag({path!r}, tok)
else:
    ds = ChatDataset({path!r}, tok, chat_template=TOOL_TEMPLATE)
n = len(ds); _ = ds[n - 1]
print(time.perf_counter() - start, n)
"""


def _write_data(root: Path, rows: int) -> dict[str, Path]:
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    import pandas as pd
    from sft_fixtures import chat_rows, hellaswag_rows

    hella = root / "hellaswag.parquet"
    pd.DataFrame(hellaswag_rows(rows)).to_parquet(hella)
    chat = root / "chat.jsonl"
    chat.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(rows)))
    return {"hellaswag": hella, "chat": chat}


def _build(kind: str, path: Path, tok: Path, cache: Path) -> tuple[float, int]:
    code = BUILD.format(
        repo=str(REPO), tests=str(REPO / "tests"), tok=str(tok), kind=kind, path=str(path)
    )
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[-2]), int(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    sys.path[:0] = [str(REPO)]
    from cli.demo_assets import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = root / "tok"
        build_tokenizer(tok)
        files = _write_data(root, args.rows)
        print(f"{'dataset':<10} {'rows':>7} {'first (s)':>10} {'second (s)':>11} {'ratio':>8}")
        for kind, path in files.items():
            cache = root / f"cache-{kind}"
            first, n = _build(kind, path, tok, cache)
            second, _ = _build(kind, path, tok, cache)
            print(f"{kind:<10} {n:>7} {first:>10.3f} {second:>11.4f} {first / second:>8.0f}x")


if __name__ == "__main__":
    main()
