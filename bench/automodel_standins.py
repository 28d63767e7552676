"""Shrink NeMo AutoModel's example recipes into tiny stand-ins and train each under torchrun.

    git -C <Automodel checkout> archive HEAD examples | tar -x -C /tmp/am
    python3 bench/automodel_standins.py /tmp/am/examples [--only llama3_2] [--limit 10]
        [--nproc 2] [--keep] [--json out.json] [--work DIR] [--all]

A stand-in keeps a recipe's sections, `_target_`s and keys, and shrinks only sizes: a tiny
model of the same family (`bench/standin_families.py`) served under the very hub name the
recipe uses by a local server speaking the hub's protocol (`tests/hub_server.py`), tiny
parquet data in the real dataset repo's layout under the dataset name it uses, max_steps 3
with a validation pass and a checkpoint save inside them where the recipe has them, batch
sizes for the new data-parallel size, seq lengths of 64, and each parallel size above 1
(tp, pp, cp, ep, dp_replicate) as 2 on a world of 2-4 CPU ranks. It is validated as an
online server validates (`hub_fetch`: the config is fetched and the commit pinned), and
the stored recipe runs as a worker runs it: `torchrun -m trainer` with an empty hub cache,
downloading the pinned snapshot. By default only the in-scope recipes
`bench/automodel_sweep.py` finds valid at their own topology, or refused only because a hub
config was unreadable offline, are run (`--all`: every in-scope recipe). Prints one row per
recipe (family, layout, dataset class, PEFT, result, seconds) and exits 1 when a stand-in
that validated did not train. AutoModel's files are read, never copied.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "bench")]  # the hub server, the sweep

from automodel_sweep import HUB_UNREADABLE, IN_SCOPE, topology  # noqa: E402
from hub_server import serve_hub, write_dataset_repo  # noqa: E402
from standin_families import (  # noqa: E402
    DATASETS,
    VOCAB,
    build_model_repo,
    dataset_files,
    family_of,
    tokenizer_corpus,
)

SEQ = 64
PACKED = 128
PARALLEL = ("tp_size", "pp_size", "cp_size", "ep_size", "dp_replicate_size")
MODEL_SECTIONS = ("model", "teacher_model", "tokenizer", "dataset", "validation_dataset")
MODEL_KEYS = ("pretrained_model_name_or_path", "tokenizer_name_or_path", "config")
DATA_KEYS = ("path_or_dataset", "dataset_name", "path_or_dataset_id")
SEQ_KEYS = ("seq_length", "seq_len", "max_seq_length", "max_length")
RUN_TIMEOUT_S = 900


@dataclass
class Row:
    recipe: str
    family: str = ""
    layout: str = ""
    dataset: str = ""
    peft: bool = False
    nproc: int = 0
    result: str = ""
    detail: str = ""
    seconds: float = 0.0


# Which recipes -------------------------------------------------------------------------------


def candidates(root: Path, everything: bool) -> list[Path]:
    """In-scope recipes; unless `everything`, those valid at their own topology or refused
    only because a hub config.json was not readable (what the stand-in hub supplies)."""
    from jobs.recipe.validation import validate_job

    paths = [p for p in sorted(root.rglob("*.yaml")) if p.relative_to(root).parts[0] in IN_SCOPE]
    if everything:
        return paths
    kept = []
    for path in paths:
        result = validate_job(path, [], topology(path), allow_remote_code=True)
        if result.valid or all(_hub_only(str(e)) for e in result.errors):
            kept.append(path)
    return kept


def _hub_only(error: str) -> bool:
    return HUB_UNREADABLE in error or "depends on the architecture, and the model" in error


# The stand-in recipe -------------------------------------------------------------------------


def hub_models(data: dict[str, Any]) -> set[str]:
    """The hub model names (org/name) the recipe's model, teacher, tokenizer and datasets name."""
    from jobs.recipe.paths.roots import is_hub_name

    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in MODEL_KEYS and isinstance(value, str) and is_hub_name(value):
                    names.add(value)
                walk(value)

    for section in MODEL_SECTIONS:
        walk(data.get(section))
    return names


def hub_datasets(data: dict[str, Any]) -> set[str]:
    from jobs.recipe.paths.roots import is_hub_name

    return {
        value
        for section in ("dataset", "validation_dataset")
        if isinstance(block := data.get(section), dict)
        for key in DATA_KEYS
        if isinstance(value := block.get(key), str) and is_hub_name(value)
    }


def layout_sizes(data: dict[str, Any]) -> dict[str, int]:
    """The parallel sizes above 1 the recipe states (tp, pp, cp, ep, dp_replicate)."""
    dist = data.get("distributed") if isinstance(data.get("distributed"), dict) else {}
    return {k: v for k in PARALLEL if isinstance(v := dist.get(k), int) and v > 1}


def standin_world(sizes: dict[str, int], nproc: int | None) -> tuple[dict[str, int], int]:
    """Each stated size as 2, and the world: model-parallel ranks times a data-parallel size
    of 2 where that stays within 4 ranks (expert parallelism spans the data-parallel ranks)."""
    shrunk = {k: 2 for k in sizes}
    model_ranks = 1
    for key in ("tp_size", "pp_size", "cp_size", "dp_replicate_size"):
        model_ranks *= shrunk.get(key, 1)
    world = nproc or (model_ranks * 2 if model_ranks * 2 <= 4 else model_ranks)
    return shrunk, world


def grad_accumulation(data: dict[str, Any], path: Path) -> int:
    """2 where the recipe accumulates gradients at its own topology, else 1."""
    step = data.get("step_scheduler") or {}
    dist = data.get("distributed") if isinstance(data.get("distributed"), dict) else {}
    res = topology(path)
    model_ranks = 1
    for key in ("tp_size", "pp_size", "cp_size"):
        model_ranks *= dist.get(key) if isinstance(dist.get(key), int) and dist[key] > 0 else 1
    dp = max(1, res["nnodes"] * res["nproc_per_node"] // model_ranks)
    local, total = step.get("local_batch_size") or 1, step.get("global_batch_size")
    return 2 if isinstance(total, int) and isinstance(local, int) and total > local * dp else 1


def shrink(data: dict[str, Any], path: Path, run_dir: Path, nproc: int | None) -> tuple[dict, int]:
    """The stand-in of recipe `data` and its world size: same sections, targets and keys."""
    out = copy.deepcopy(data)
    shrunk, world = standin_world(layout_sizes(data), nproc)
    dist = out.get("distributed")
    if isinstance(dist, dict):
        dist.update(shrunk)
        if isinstance(dist.get("dp_size"), int):
            dist["dp_size"] = world // _model_ranks(shrunk)
        if isinstance(dist.get("pipeline"), dict) and "pp_microbatch_size" in dist["pipeline"]:
            dist["pipeline"]["pp_microbatch_size"] = 1
    dp = world // _model_ranks(shrunk)
    _shrink_steps(out, dp, grad_accumulation(data, path))
    _shrink_data(out)
    checkpoint = out.get("checkpoint")
    if isinstance(checkpoint, dict) and "checkpoint_dir" in checkpoint:
        checkpoint["checkpoint_dir"] = str(run_dir / "checkpoints")
    dist_env = out.get("dist_env")
    if isinstance(dist_env, dict) and dist_env.get("backend") == "nccl":
        dist_env["backend"] = "gloo"  # NCCL needs GPUs; the stand-ins run on CPU ranks
    benchmark = out.get("benchmark")
    if isinstance(benchmark, dict) and "warmup_steps" in benchmark:
        benchmark["warmup_steps"] = 1
    return out, world


def _model_ranks(shrunk: dict[str, int]) -> int:
    ranks = 1
    for key in ("tp_size", "pp_size", "cp_size"):
        ranks *= shrunk.get(key, 1)
    return ranks


def _shrink_steps(out: dict[str, Any], dp: int, accumulation: int) -> None:
    step = out.setdefault("step_scheduler", {})
    local = min(int(step.get("local_batch_size") or 1), 2)
    step["local_batch_size"] = local
    if "global_batch_size" in step:
        step["global_batch_size"] = local * dp * accumulation
    step["max_steps"] = 3
    if out.get("validation_dataset") or "val_every_steps" in step:
        step["val_every_steps"] = 2
    checkpoint = out.get("checkpoint")
    enabled = not isinstance(checkpoint, dict) or checkpoint.get("enabled", True)
    if enabled and (isinstance(checkpoint, dict) or "ckpt_every_steps" in step):
        step["ckpt_every_steps"] = 2
    for mock in (out.get("dataset"), out.get("validation_dataset")):
        if isinstance(mock, dict) and "batch_size" in mock:
            mock["batch_size"] = local


def _shrink_data(out: dict[str, Any]) -> None:
    for section in ("dataset", "validation_dataset"):
        block = out.get(section)
        if not isinstance(block, dict):
            continue
        for key in SEQ_KEYS:
            if isinstance(block.get(key), int):
                block[key] = SEQ
        if isinstance(block.get("num_samples"), int):
            block["num_samples"] = 256
        if isinstance(block.get("vocab_size"), int):
            block["vocab_size"] = min(block["vocab_size"], VOCAB)
    packed = out.get("packed_sequence")
    if isinstance(packed, dict) and (packed.get("packed_sequence_size") or 0) > 0:
        packed["packed_sequence_size"] = PACKED


def describe(data: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """The table's columns for one recipe: family, layout, dataset class, PEFT."""
    own = hub_models({"model": data.get("model")})  # the student's, before a teacher's
    model = next(iter(sorted(own or names)), "")
    family = family_of(model)
    dist = data.get("distributed") if isinstance(data.get("distributed"), dict) else {}
    sizes = " ".join(f"{k[:-5]}{v}" for k, v in layout_sizes(data).items())
    dataset = data.get("dataset") if isinstance(data.get("dataset"), dict) else {}
    target = str(dataset.get("_target_", ""))
    return {
        "family": family[0] if family else f"? ({model or 'no hub model'})",
        "layout": f"{dist.get('strategy') or 'default'} {sizes}".strip(),
        "dataset": target.rsplit(".", 1)[-1],
        "peft": isinstance(data.get("peft"), dict),
    }


# Serving and running -------------------------------------------------------------------------


class StandinHub:
    """The stand-in hub's files: tiny models and datasets, built once per name."""

    def __init__(self, root: Path):
        from cli.demo_assets import build_tokenizer

        self.root = root
        self.tokenizer = root.parent / "tokenizer"
        if not self.tokenizer.is_dir():
            build_tokenizer(self.tokenizer, vocab_size=VOCAB, corpus=tokenizer_corpus())

    def model(self, name: str) -> bool:
        repo = self.root / name
        return repo.is_dir() or build_model_repo(repo, name, self.tokenizer) is not None

    def dataset(self, name: str) -> bool:
        if name not in DATASETS:
            return False
        if not (self.root / "datasets" / name).is_dir():
            write_dataset_repo(self.root, name, dataset_files(name))
        return True


def validate(standin: dict[str, Any], world: int, work: Path) -> Any:
    """Validate as an online server does: fetch and pin each hub config, CPU, `world` ranks."""
    from jobs.recipe.settings import RecipeSettings
    from jobs.recipe.validation import validate_job

    settings = RecipeSettings(
        data_roots=str(work), checkpoint_roots=str(work), hub_fetch=True, allow_remote_code=True
    )
    resources = {"nproc_per_node": world, "accelerator": "cpu"}
    return validate_job(standin, [], resources, settings)


def unmet_requirements(plan: dict[str, Any]) -> str:
    """The optional packages the job requires that this interpreter lacks: a worker claims
    only jobs whose `plan.requires` it can import, so this machine's would not run it."""
    from jobs.recipe.plan.requirements import local_requirement_warnings

    return "; ".join(f"{w.loc}: {w.msg}" for w in local_requirement_warnings(plan["requires"]))


def trainer_env(endpoint: str, work: Path, run_dir: Path) -> dict[str, str]:
    """A worker's environment: online, an empty hub cache of its own, the stand-in hub."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    cache = run_dir.parent / f"{run_dir.name}.cache"
    return env | {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(cache),
        "HF_HUB_CACHE": str(cache / "hub"),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
        "TUNEYARD_DATA_ROOTS": str(work),
        "TUNEYARD_CHECKPOINT_ROOTS": str(work),
        "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_trainer(stored: Path, run_dir: Path, world: int, env: dict[str, str]) -> tuple[str, str]:
    """Run the stored recipe under torchrun; ("trained", what ran) or ("failed", last error)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        "-m",
        "trainer",
        "--recipe",
        str(stored),
        "--run-dir",
        str(run_dir),
    ]
    log = run_dir.parent / f"{run_dir.name}.log"
    try:
        proc = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out", -1
    log.write_text(output if isinstance(output, str) else output.decode(errors="replace"))
    records = _records(run_dir)
    train = [r for r in records if r.get("kind") == "train"]
    if code == 0 and len(train) == 3:
        val = sum(r.get("kind") == "val" for r in records)
        saved = (run_dir / "checkpoints" / "LATEST").exists() or any(
            (run_dir / "checkpoints").glob("*")
        )
        return "trained", f"3 steps, {val} val, checkpoint {'saved' if saved else 'none'}"
    return "failed", f"rc {code}, {len(train)} steps: {last_error(run_dir, str(output))}"


def _records(run_dir: Path) -> list[dict[str, Any]]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]


def last_error(run_dir: Path, output: str) -> str:
    """The failing rank's own record if one was written, else the last error line printed."""
    records = sorted((run_dir / "failures").glob("rank-*.json"))
    if records:
        failure = json.loads(records[0].read_text())
        return f"[{failure.get('code')}] {failure.get('message')}"
    lines = [x.strip() for x in output.splitlines() if re.search(r"Error|error:|Exception", x)]
    return lines[-1][:400] if lines else (output.strip().splitlines() or ["no output"])[-1][:400]


def read_recipe(path: Path) -> dict[str, Any]:
    """The recipe as the API parses a YAML body (`1e-8` is a number there, not PyYAML's string)."""
    from jobs.recipe.validation import load_recipe

    data, _ = load_recipe(path)
    return data or {}


def run_one(path: Path, root: Path, hub: StandinHub, endpoint: str, work: Path, args) -> Row:
    """Build, validate and train one recipe's stand-in."""
    started = time.monotonic()
    relative = str(path.relative_to(root))
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", relative.removesuffix(".yaml"))
    data = read_recipe(path)
    names, datasets = hub_models(data), hub_datasets(data)
    row = Row(relative, **describe(data, names))
    missing = [n for n in sorted(names) if not hub.model(n)]
    missing += [f"dataset {d}" for d in sorted(datasets) if not hub.dataset(d)]
    if missing:
        row.result, row.detail = "no stand-in", f"no tiny family for {', '.join(missing)}"
        return _timed(row, started)
    run_dir = work / "runs" / slug
    shutil.rmtree(run_dir, ignore_errors=True)
    standin, row.nproc = shrink(data, path, run_dir, args.nproc)
    (work / "recipes").mkdir(exist_ok=True)
    (work / "recipes" / f"{slug}.yaml").write_text(yaml.safe_dump(standin, sort_keys=False))
    result = validate(standin, row.nproc, work)
    if not result.valid:
        row.result = "refused"
        row.detail = "; ".join(f"{e.loc}: {e.msg}" for e in result.errors)
        return _timed(row, started)
    unmet = unmet_requirements(result.plan)
    if unmet:  # no worker of this machine's kind would claim the job
        row.result, row.detail = "not claimable here", unmet
        return _timed(row, started)
    stored = work / "recipes" / f"{slug}.json"
    stored.write_text(json.dumps(result.recipe))
    env = trainer_env(endpoint, work, run_dir)
    row.result, row.detail = run_trainer(stored, run_dir, row.nproc, env)
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(run_dir.parent / f"{run_dir.name}.cache", ignore_errors=True)
    return _timed(row, started)


def _timed(row: Row, started: float) -> Row:
    row.seconds = round(time.monotonic() - started, 1)
    return row


# Report --------------------------------------------------------------------------------------


def print_row(row: Row) -> None:
    peft = "peft" if row.peft else "-"
    print(
        f"| {row.recipe} | {row.family} | {row.layout} | {row.dataset} | {peft} | "
        f"{row.nproc or '-'} | {row.result}: {row.detail} | {row.seconds:.0f} |",
        flush=True,
    )


def summary(rows: list[Row]) -> None:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.result] = counts.get(row.result, 0) + 1
    print(f"\n{len(rows)} recipes: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))


def online_hub_client() -> None:
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: this process validates online."""
    os.environ["HF_HUB_OFFLINE"] = "0"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path, help="AutoModel's examples/ directory")
    parser.add_argument("--only", action="append", default=[], help="path substring (repeatable)")
    parser.add_argument("--limit", type=int, help="run at most this many recipes")
    parser.add_argument("--nproc", type=int, help="ranks per stand-in (default: 2 or 4)")
    parser.add_argument("--keep", action="store_true", help="keep run dirs and caches")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--work", type=Path, help="work dir (default: a new temporary one)")
    parser.add_argument("--all", action="store_true", help="every in-scope recipe")
    args = parser.parse_args()
    online_hub_client()
    work = (args.work or Path(tempfile.mkdtemp(prefix="standins-"))).resolve()
    (work / "hub").mkdir(parents=True, exist_ok=True)
    os.environ["HF_HUB_CACHE"] = str(work / "api-cache")  # the API's cache, not a worker's
    paths = candidates(args.examples, args.all)
    paths = [p for p in paths if not args.only or any(s in str(p) for s in args.only)]
    paths = paths[: args.limit] if args.limit else paths
    print(f"work dir {work}; {len(paths)} recipes\n")
    print("| recipe | family | layout | dataset | peft | ranks | result | s |")
    print("|---|---|---|---|---|---|---|---|")
    hub, rows = StandinHub(work / "hub"), []
    with serve_hub(work / "hub") as endpoint:
        os.environ["HF_ENDPOINT"] = endpoint
        for path in paths:
            rows.append(run_one(path, args.examples, hub, endpoint, work, args))
            print_row(rows[-1])
    summary(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.result == "failed" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
