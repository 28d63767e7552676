"""Fixtures for trainer runs: the tiny assets (built once) and the in-process entry point."""

from __future__ import annotations

import json
import shutil

import pytest
from trainer_harness import Assets, build_assets, write_recipe

from jobs.store.settings import get_settings


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    return build_assets(tmp_path_factory.mktemp("trainer-assets"))


@pytest.fixture
def run_main(assets: Assets, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    monkeypatch.setenv("TUNEYARD_DATA_ROOTS", str(assets.root))
    monkeypatch.setenv("TUNEYARD_CHECKPOINT_ROOTS", str(assets.root))
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    get_settings.cache_clear()

    def run(name: str, recipe: dict, *overrides: str) -> tuple[int, str, list[dict]]:
        from trainer.__main__ import main

        run_dir = assets.root / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        code = main(
            [
                "--recipe",
                str(write_recipe(assets, name, recipe)),
                "--run-dir",
                str(run_dir),
                *overrides,
            ]
        )
        output = capsys.readouterr()
        events_file = run_dir / "events.jsonl"
        events = (
            [json.loads(x) for x in events_file.read_text().splitlines()]
            if events_file.exists()
            else []
        )
        return code, output.out + output.err, events

    yield run
    get_settings.cache_clear()


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1 for code that already imported huggingface_hub: no download possible."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
