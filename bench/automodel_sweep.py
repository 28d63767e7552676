"""Validate NeMo AutoModel's example recipes at their own topology; print counts by scope and cause.

    git -C <Automodel checkout> archive HEAD examples | tar -x -C /tmp/am
    python3 bench/automodel_sweep.py /tmp/am/examples [--json out.json] [--causes 40]

Each YAML under the path is validated as `tuneyard validate` would, on CUDA, at the node and
GPU counts the recipe states (`ci.nodes`, `ci.nproc_per_node` or 4 per GB200 node else 8;
`benchmark.num_nodes`, at least the nodes its explicit parallel sizes fill, with the CI's
`local_batch_size`), from the checkout's root as a user of AutoModel runs them (its
relative paths, e.g. `examples/.../chat_template.jinja`, resolve there), with remote code granted (an operator's decision, not a recipe
property). In scope are the causal-LM directories (fine-tuning, pretraining, KD, benchmarks,
convergence, long context); every other directory's recipe should answer with one "not
supported" error. Prints the valid count, the hub-config refusals, the out-of-scope answers,
crashes, and the most frequent first causes. AutoModel's files are read, never copied.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from jobs.recipe.validation import validate_job

IN_SCOPE = {
    "llm_finetune",
    "llm_pretrain",
    "llm_kd",
    "llm_benchmark",
    "convergence",
    "long_context_validation",
}
HUB_UNREADABLE = "config.json is not readable here"
# A local data file the recipe names that is not on this machine (the user's own data, or
# files AutoModel's repository does not ship), or a checkpoint directory outside this
# server's checkpoint roots (an operator's setting): the environment, not a refusal of the
# recipe.
ABSENT_DATA = re.compile(
    r"^(\w*dataset\.[\w.]+: '[^']*' (does not exist|matches no file)"
    r"|checkpoint\.checkpoint_dir: '[^']*' is outside the allowed roots)"
)


def _recipe(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        data = {}
    return data if isinstance(data, dict) else {}


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    return data[name] if isinstance(data.get(name), dict) else {}


def topology(path: Path) -> dict[str, Any]:
    """The resources the recipe says it runs on: its CI's node and GPU counts (1 node of 8
    GPUs, 4 on GB200, when it says nothing), and at least the nodes that its own explicit
    parallel sizes fill (a 70B pretrain with dp 2 x tp 4 x pp 4 runs on 4 nodes)."""
    data = _recipe(path)
    ci, bench = _section(data, "ci"), _section(data, "benchmark")
    per_node = int(ci.get("nproc_per_node") or (4 if "gb200" in str(ci.get("cluster_tag")) else 8))
    sizes = _section(data, "distributed")
    world = 1
    for name in ("dp_size", "tp_size", "cp_size", "pp_size"):
        if isinstance(sizes.get(name), int) and sizes[name] > 0:
            world *= sizes[name]
    nodes = max(int(ci.get("nodes") or bench.get("num_nodes") or 1), -(-world // per_node))
    return {"nnodes": nodes, "nproc_per_node": per_node, "accelerator": "cuda"}


def ci_overrides(path: Path) -> list[str]:
    """What AutoModel's CI sets at that topology: `ci.local_batch_size`."""
    local = _section(_recipe(path), "ci").get("local_batch_size")
    return [f"step_scheduler.local_batch_size={local}"] if isinstance(local, int) else []


def causal_lm_recipe(path: Path) -> bool:
    """A next-token-prediction recipe class with a causal-LM loader: an LLM recipe wherever
    AutoModel files it (its VLM benchmarks time a VL checkpoint's text backbone this way)."""
    data = _recipe(path)
    loader = str(_section(data, "model").get("_target_", ""))
    return "NextTokenPrediction" in str(data.get("recipe", "")) and "ForCausalLM" in loader


def sweep(root: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(root.rglob("*.yaml")):
        relative = path.relative_to(root)
        try:
            result = validate_job(path, ci_overrides(path), topology(path), allow_remote_code=True)
            errors = [str(e) for e in result.errors]
        except Exception as exc:  # noqa: BLE001 - a crash is what the sweep looks for
            result, errors = None, [f"CRASH {type(exc).__name__}: {exc}"]
        rows.append(
            {
                "path": str(relative),
                "in_scope": relative.parts[0] in IN_SCOPE,
                "causal_lm": causal_lm_recipe(path),
                "valid": bool(result and result.valid),
                "errors": errors,
            }
        )
    return rows


def cause(error: str) -> str:
    """An error with its quoted values and numbers blanked, to count alike ones together."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'X'", error))[:120]


def report(rows: list[dict[str, Any]], causes: int) -> None:
    inside = [r for r in rows if r["in_scope"]]
    outside = [r for r in rows if not r["in_scope"]]
    refused = [r for r in inside if not r["valid"]]
    hub = [r for r in refused if any(HUB_UNREADABLE in e for e in r["errors"])]
    single = [r for r in outside if len(r["errors"]) == 1 and "not supported" in r["errors"][0]]
    llm = [r for r in outside if r not in single and r.get("causal_lm")]
    print(f"in scope: {len(inside)} recipes, {len(inside) - len(refused)} valid")
    print(f"  refused: {len(refused)}; with an unreadable hub config among the causes: {len(hub)}")
    other = [r for r in refused if r not in hub]
    absent = [r for r in other if all(ABSENT_DATA.match(e) for e in r["errors"])]
    print(
        f"  refused for other reasons only: {len(other)}, of which {len(absent)} only name "
        "local data files that are absent here or a checkpoint dir outside this server's roots"
    )
    print(
        f"out of scope: {len(outside)} recipes, {len(single)} answer one 'not supported'; "
        f"{len(llm)} are causal-LM recipes in another family's directory, answered by the "
        f"LLM rules: {', '.join(r['path'] for r in llm)}"
    )
    print(f"crashes: {sum(e.startswith('CRASH') for r in rows for e in r['errors'])}")
    by_family = collections.Counter(Path(r["path"]).parts[1] for r in other)
    print("refused for other reasons, by family:", dict(by_family.most_common()))
    counts = collections.Counter(cause(r["errors"][0]) for r in refused if r["errors"])
    for text, n in counts.most_common(causes):
        print(f"{n:4d}  {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path, help="AutoModel's examples/ directory")
    parser.add_argument("--json", type=Path, help="write every recipe's result here")
    parser.add_argument("--causes", type=int, default=30, help="first causes to list")
    args = parser.parse_args()
    examples, out = args.examples.resolve(), args.json and args.json.resolve()
    os.chdir(examples.parent)  # the checkout's root: where its relative paths point
    rows = sweep(examples)
    if out:
        out.write_text(json.dumps(rows, indent=1))
    report(rows, args.causes)


if __name__ == "__main__":
    main()
