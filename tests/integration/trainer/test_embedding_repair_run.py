"""A run with `embedding_row_repair:` trains the repaired model: the zeroed input-embedding rows
of the checkpoint it starts from are, in its first saved checkpoint, the output rows'
directions at the healthy rows' RMS norm (an lr of 1e-12 keeps that checkpoint equal, below
float32 rounding, to the model the first step trained), every healthy row as loaded. Under
FSDP2 the section takes the full load (whole tensors repaired, then sharded) instead of the
shard-only path; a resume repairs the base load and then loads the checkpoint over it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from trainer_harness import Assets, base_recipe, launch, write_recipe

from trainer.__main__ import load_recipe
from trainer.setup import _meta_model

DAMAGED = [0, 3, 7]  # 0 is the padding row, zeros already; 3 and 7 are zeroed here
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
FSDP2 = {"strategy": "fsdp2"}


def _damaged_model(assets: Assets) -> Path:
    from safetensors.torch import load_file, save_file

    directory = assets.root / "damaged-llama"
    if not directory.exists():
        shutil.copytree(assets.model, directory)
        weights = load_file(directory / "model.safetensors")
        weights[EMBED][DAMAGED] = 0.0
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def _recipe(assets: Assets, **sections) -> dict:
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": 1, "checkpoint_interval": 1, "val_check_interval": 1},
        optimizer={"_target_": "torch.optim.AdamW", "lr": 1.0e-12, "weight_decay": 0.0},
        lr_scheduler=None,
        embedding_row_repair={"min_norm": 1.0e-6, "max_rows": 8},
        **sections,
    )
    recipe["model"]["pretrained_model_name_or_path"] = str(_damaged_model(assets))
    return recipe


def _expected_rows(assets: Assets) -> tuple[dict, list[int], torch.Tensor]:
    """The loaded weights, the healthy row ids and the damaged rows' hand-computed repair:
    each output row's direction at the RMS L2 norm of the healthy input rows."""
    from safetensors.torch import load_file

    loaded = load_file(_damaged_model(assets) / "model.safetensors")
    healthy = [i for i in range(loaded[EMBED].shape[0]) if i not in DAMAGED]
    rms = loaded[EMBED][healthy].double().square().sum(dim=1).mean().sqrt()
    source = loaded[HEAD][DAMAGED].double()
    return loaded, healthy, source / source.norm(dim=1, keepdim=True) * rms


def _assert_step_1_repaired(assets: Assets, run_dir: Path) -> None:
    from safetensors.torch import load_file

    loaded, healthy, expected = _expected_rows(assets)
    model_dir = run_dir / "checkpoints" / "step_1" / "model"
    saved = {k: v for p in model_dir.glob("*.safetensors") for k, v in load_file(p).items()}
    torch.testing.assert_close(saved[EMBED][DAMAGED].double(), expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(saved[EMBED][healthy], loaded[EMBED][healthy], rtol=0, atol=1e-9)
    torch.testing.assert_close(saved[HEAD], loaded[HEAD], rtol=0, atol=1e-9)


def test_the_first_step_trains_the_repaired_rows(assets: Assets, run_main) -> None:
    code, output, _ = run_main("embedding-repair", _recipe(assets))
    assert code == 0, output[-3000:]
    assert "repaired 3 input embedding row(s) in model.embed_tokens.weight" in output
    assert f"ids={DAMAGED}" in output
    _assert_step_1_repaired(assets, assets.root / "runs" / "embedding-repair")


def test_fsdp2_takes_the_full_load_to_repair(assets: Assets, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEYARD_DATA_ROOTS", str(assets.root))
    recipe = _recipe(assets, distributed=FSDP2)
    path = write_recipe(assets, "embedding-repair-fsdp2", recipe)
    loaded = load_recipe(path, [], tmp_path)
    assert loaded is not None and _meta_model(loaded) is None
    del recipe["embedding_row_repair"]
    path = write_recipe(assets, "embedding-repair-fsdp2", recipe)
    assert _meta_model(load_recipe(path, [], tmp_path)) is not None


@pytest.mark.slow
def test_two_fsdp2_ranks_train_the_repaired_rows(assets: Assets) -> None:
    run = launch(assets, "embedding-repair-fsdp2-run", _recipe(assets, distributed=FSDP2), 2)
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count(f"ids={DAMAGED}") == 1  # rank 0 logs it
    _assert_step_1_repaired(assets, run.run_dir)


def test_a_resume_repairs_the_base_load_and_then_loads_the_checkpoint(
    assets: Assets, run_main
) -> None:
    """As in AutoModel, the repair runs on the base load and the checkpoint is loaded over
    it: full weights resume as saved. The resumed recipe's threshold also takes in the five
    smallest healthy rows, which the checkpoint holds too: the resume fingerprint (restored
    state = saved state) and the next checkpoint show the checkpoint's rows were kept."""
    from safetensors.torch import load_file

    code, output, _ = run_main("embedding-repair-first", _recipe(assets))
    assert code == 0, output[-3000:]
    base = load_file(_damaged_model(assets) / "model.safetensors")
    norms = base[EMBED].norm(dim=1)
    threshold = float(norms[norms > 0].sort().values[4])
    low = [i for i, n in enumerate(norms.tolist()) if 0 < n <= threshold]
    assert len(low) == 5 and (base[HEAD][low].norm(dim=1) > threshold).all()
    step_1 = assets.root / "runs" / "embedding-repair-first" / "checkpoints" / "step_1"
    recipe = _recipe(assets, restore_from={"path": str(step_1)})
    recipe["step_scheduler"]["max_steps"] = 2
    recipe["embedding_row_repair"] = {"min_norm": threshold, "max_rows": 8}
    code, output, _ = run_main("embedding-repair-resume", recipe)
    assert code == 0, output[-3000:]
    assert "repaired 8 input embedding row(s)" in output and "resumed at step 1" in output
    step_2 = assets.root / "runs" / "embedding-repair-resume" / "checkpoints" / "step_2"
    saved = load_file(step_1 / "model" / "model.safetensors")
    resumed = load_file(step_2 / "model" / "model.safetensors")
    torch.testing.assert_close(resumed[EMBED], saved[EMBED], rtol=0, atol=1e-9)
