"""A hub model validated online trains at the commit validation read (trainer.hub_models).

The model lives only on a local server that speaks the hub's file protocol. Validation (an
online server) fetches its config and pins the commit (and the commit of a repository named
only as the tokenizer); then the repository's `main` moves to a config the weights do not
fit; then two torchrun ranks with an empty cache run the stored recipe: they download the
pinned snapshots, not `main` (the tokenizer's without weights), and train.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hub_server import repo_commit, serve_hub, write_repo
from trainer_harness import REPO, Assets, base_recipe, trainer_command, trainer_env

from jobs.recipe.settings import RecipeSettings
from jobs.recipe.validation import validate_job

pytestmark = pytest.mark.slow
NAME = "org/tiny-llama"
TOKENIZER = "org/tiny-tokenizer"  # the same files, named only as the recipe's tokenizer


def _publish(assets: Assets, hub: Path) -> Path:
    repo = hub / NAME
    shutil.copytree(assets.model, repo)
    return repo


def test_two_ranks_download_and_train_the_validated_commit(
    assets: Assets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    hub = tmp_path / "hub"
    repo = _publish(assets, hub)
    pinned = repo_commit(repo)
    shutil.copytree(assets.model, hub / TOKENIZER)
    tokenizer_pin = repo_commit(hub / TOKENIZER)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "api-cache"))
    recipe = base_recipe(assets, step_scheduler={"max_steps": 4, "val_check_interval": 4})
    recipe["model"]["pretrained_model_name_or_path"] = NAME
    recipe["tokenizer"] = {
        "_target_": "transformers.AutoTokenizer.from_pretrained",
        "pretrained_model_name_or_path": TOKENIZER,
    }
    recipe["distributed"] = {"strategy": "fsdp2"}
    settings = RecipeSettings(data_roots=str(assets.root), hub_fetch=True)
    with serve_hub(hub) as endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        result = validate_job(recipe, [], {"nproc_per_node": 2}, settings)
        assert result.valid, [str(e) for e in result.errors]
        assert result.plan["hub_revisions"] == {NAME: pinned, TOKENIZER: tokenizer_pin}
        broken = json.loads((repo / "config.json").read_text()) | {"hidden_size": 48}
        write_repo(hub, NAME, {"config.json": broken})  # main moves on
        assert repo_commit(repo) != pinned

        stored = tmp_path / "recipe.json"
        stored.write_text(json.dumps(result.recipe))
        run_dir = tmp_path / "run"
        env = trainer_env(assets) | {
            "HF_HUB_OFFLINE": "0",
            "HF_ENDPOINT": endpoint,
            "HF_HUB_CACHE": str(tmp_path / "worker-cache"),
        }
        proc = subprocess.run(
            trainer_command(stored, run_dir, 2),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len([r for r in map(json.loads, lines) if r["kind"] == "train"]) == 4
    snapshots = tmp_path / "worker-cache" / f"models--{NAME.replace('/', '--')}" / "snapshots"
    assert [p.name for p in snapshots.iterdir()] == [pinned]
    # the tokenizer's repository at its validated commit, without the weights it also holds
    tokenizer = tmp_path / "worker-cache" / f"models--{TOKENIZER.replace('/', '--')}" / "snapshots"
    assert [p.name for p in tokenizer.iterdir()] == [tokenizer_pin]
    files = {f.name for f in (tokenizer / tokenizer_pin).iterdir()}
    assert "tokenizer.json" in files and not any(f.endswith(".safetensors") for f in files)


def test_offline_a_worker_without_the_snapshot_says_which_commit_to_fetch(
    assets: Assets, tmp_path: Path, run_main
) -> None:
    recipe = base_recipe(assets, step_scheduler={"max_steps": 4})
    recipe["model"]["pretrained_model_name_or_path"] = NAME
    settings = RecipeSettings(data_roots=str(assets.root))
    result = validate_job(recipe, [], None, settings)
    assert result.valid, [str(e) for e in result.errors]
    stored = result.recipe
    stored["hub_revisions"] = {NAME: "a" * 40}
    path = tmp_path / "stored.json"
    path.write_text(json.dumps(stored))
    from trainer.__main__ import main

    code = main(["--recipe", str(path), "--run-dir", str(tmp_path / "run")])
    assert code == 3  # data_error
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert f"hf download {NAME} --revision {'a' * 40}" in events


def test_a_recipe_already_pinned_is_not_fetched_again(assets: Assets) -> None:
    """A run rebuilt after a rollback holds snapshot paths, not hub names: pinning it again
    asks nothing of the hub (the suite runs offline, where a fetch would fail)."""
    from trainer.hub_models import pin_hub_models

    settings = RecipeSettings(data_roots=str(assets.root))
    typed = validate_job(base_recipe(assets), [], None, settings).typed
    pinned = dataclasses.replace(typed, hub_revisions={NAME: "a" * 40})
    assert pin_hub_models(pinned) is pinned
