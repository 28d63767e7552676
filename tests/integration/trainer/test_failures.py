"""Bad inputs and abnormal endings: each exits with its code, a clear message, no traceback.

Most cases call the entry point in this process (`trainer.__main__.main`, a one-rank gloo
group) to spare an interpreter start each; SIGTERM runs in a real subprocess.
"""

from __future__ import annotations

import json
import signal

import torch
from trainer_harness import Assets, base_recipe, launch_until

from jobs.recipe.exit_codes import ExitCode


def assert_failed(code: int, output: str, events: list[dict], expected: ExitCode, *words: str):
    assert code == expected, output[-2000:]
    assert "Traceback" not in output
    failed = events[-1]
    assert failed["event"] == "failed" and failed["exit_code"] == int(expected)
    for word in words:
        assert word in failed["message"], failed["message"]
        assert word in output


def short_recipe(assets: Assets, **sections) -> dict:
    step = {"max_steps": 2, "val_check_interval": None, "checkpoint_interval": None}
    sections.setdefault("lr_scheduler", {"warmup_steps": 1})
    return base_recipe(
        assets, step_scheduler={**step, **sections.pop("step_scheduler", {})}, **sections
    )


def test_invalid_recipe_exits_2_before_building_a_model(run_main, assets: Assets) -> None:
    recipe = short_recipe(assets, optimizer={"lrr": 0.1})
    code, output, events = run_main("invalid", recipe)
    assert_failed(code, output, events, ExitCode.INVALID_RECIPE, "optimizer.lrr")
    assert not (assets.root / "runs" / "invalid" / "checkpoints").exists()


def test_missing_data_file_is_refused_by_validation(run_main, assets: Assets) -> None:
    recipe = short_recipe(assets, dataset={"path": str(assets.root / "data" / "nope.jsonl")})
    code, output, events = run_main("missing-data", recipe)
    assert_failed(code, output, events, ExitCode.INVALID_RECIPE, "dataset.path", "nope.jsonl")


def test_malformed_data_line_is_a_data_error(run_main, assets: Assets) -> None:
    bad = assets.root / "data" / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "no completion"}\n')
    code, output, events = run_main("bad-data", short_recipe(assets, dataset={"path": str(bad)}))
    assert_failed(code, output, events, ExitCode.DATA_ERROR, "bad.jsonl:2", "completion")


def test_missing_squad_split_is_a_data_error(run_main, assets: Assets) -> None:
    from cli.demo_assets import write_squad_dir

    squad = write_squad_dir(assets.root / "squad-no-val")
    (squad / "validation.json").unlink()
    val = {
        "_target_": "tuneyard.datasets.SquadDataset",
        "path_or_dataset": str(squad),
        "split": "validation",
    }
    recipe = short_recipe(assets)
    recipe["validation_dataset"] = val
    code, output, events = run_main("squad-split", recipe)
    assert_failed(code, output, events, ExitCode.DATA_ERROR, "validation.json")


def test_tokenizer_larger_than_model_vocab_is_a_data_error(run_main, assets: Assets) -> None:
    from transformers import LlamaForCausalLM

    from cli.demo_assets import tiny_llama_config

    small = assets.root / "tiny-llama-vocab256"
    LlamaForCausalLM(tiny_llama_config(vocab_size=256)).save_pretrained(small)
    model = {"pretrained_model_name_or_path": str(small)}
    dataset = {"tokenizer_name_or_path": str(assets.model)}
    recipe = short_recipe(assets, model=model, dataset=dataset)
    code, output, events = run_main("vocab", recipe)
    assert_failed(code, output, events, ExitCode.DATA_ERROR, "vocab_size is 256")


def test_checkpoint_of_another_architecture_is_refused(run_main, assets: Assets) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    qwen = assets.root / "tiny-qwen2"
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    Qwen2ForCausalLM(config).save_pretrained(qwen)
    qwen_recipe = short_recipe(
        assets,
        model={"pretrained_model_name_or_path": str(qwen)},
        dataset={"tokenizer_name_or_path": str(assets.model)},
    )
    code, output, _ = run_main("qwen", qwen_recipe)
    assert code == 0, output[-2000:]
    qwen_ckpt = assets.root / "runs" / "qwen" / "checkpoints" / "step_2"
    recipe = short_recipe(assets, restore_from={"path": str(qwen_ckpt)})
    code, output, events = run_main("other-arch", recipe)
    assert_failed(
        code, output, events, ExitCode.CHECKPOINT_ERROR, "Qwen2ForCausalLM", "LlamaForCausalLM"
    )


def test_incomplete_checkpoint_dir_is_never_used(run_main, assets: Assets) -> None:
    half = assets.root / "half-written" / "step_5"
    (half / "model").mkdir(parents=True, exist_ok=True)
    recipe = short_recipe(assets, restore_from={"path": str(half)})
    code, output, events = run_main("incomplete", recipe)
    assert_failed(code, output, events, ExitCode.CHECKPOINT_ERROR, "not a complete checkpoint")


def test_non_finite_loss_stops_with_nan_loss_naming_the_step(run_main, assets: Assets) -> None:
    recipe = short_recipe(
        assets,
        step_scheduler={"max_steps": 20},
        clip_grad_norm={},
        optimizer={"_target_": "torch.optim.SGD", "lr": 1.0e12},
        lr_scheduler=None,
    )
    recipe.pop("lr_scheduler")
    code, output, events = run_main("nan", recipe)
    assert_failed(code, output, events, ExitCode.NAN_LOSS, "at step")
    step = events[-1]["step"]
    assert f"at step {step}" in events[-1]["message"] and step >= 1
    assert events[-1]["code"] == "nan_loss"


def test_sigterm_finishes_the_step_saves_and_exits_preempted(assets: Assets) -> None:
    recipe = base_recipe(
        assets,
        step_scheduler={"max_steps": 10_000, "num_epochs": 1000, "checkpoint_interval": None},
    )
    run_dir = assets.root / "runs" / "sigterm"
    result = launch_until(assets, "sigterm", recipe, 1, run_dir, step=3, sig=signal.SIGTERM)
    assert result.returncode == ExitCode.PREEMPTED, result.output[-2000:]
    events = result.events()
    assert events[-1]["event"] == "preempted"
    step = events[-1]["step"]
    saved = [e for e in events if e["event"] == "checkpoint_saved"]
    assert saved and saved[-1]["step"] == step
    assert result.latest().name == f"step_{step}"
    assert json.loads((result.latest() / "trainer_state.json").read_text())["step"] == step
    assert max(r["step"] for r in result.records()) == step


def test_fp8_on_cpu_is_refused(run_main, assets: Assets) -> None:
    code, output, events = run_main("fp8", short_recipe(assets, fp8={"enabled": True}))
    expected = ExitCode.INVALID_RECIPE if not torch.cuda.is_available() else ExitCode.UNSUPPORTED
    assert_failed(code, output, events, expected, "fp8")
